# Round 45 call 1 (.peer in carry; COMMIT=<sha> bash docs/gpu/round45/call1/command.sh; prepared in round 43 as
# its call 2): today's kernels in the three settings against fla at the 10 shapes of issue 23 (the seven not
# timed with EXP_FTZ on the H200 first), with the taps pairs at lower-bound H32 T16384 and pre-gated H16
# T16384, under a budget, whichever card comes.
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
