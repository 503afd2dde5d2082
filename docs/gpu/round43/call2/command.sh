# Round 43 call 2 (.peer in carry; COMMIT=<sha> bash docs/gpu/round43/call2/command.sh): today's kernels
# (EXP_FTZ on by default) in the three settings against fla at the seven shapes of issue 23 not timed with
# it on the H200 (varlen H32, H16/H32 T8192, H64 T16384, H16/H32/H64 T65536), then the three timed in round 42
# call 2, with the taps pairs at lower-bound H32 T16384 and pre-gated H16 T16384, under a budget (whichever
# card comes: on an H100 the first full three-setting table there).
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh fla
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 290 python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s 230 \
    --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 \
    --shapes varlen_mixed6_H32 dense_H16_T8192 dense_H32_T8192 dense_H64_T16384 dense_H16_T65536 \
    dense_H32_T65536 dense_H64_T65536 dense_H32_T16384 dense_H16_T16384 dense_H64_T8192 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-230
