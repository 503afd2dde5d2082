# Round 54 call 5 (.peer in carry; COMMIT=<sha> bash docs/gpu/round54/call5/command.sh): issue 23's benchmark
# at this round's kernels (heads first): the three settings against fla at the 10 shapes, the taps pairs; call 3
# again, for how far fla's times and the taps pairs move between calls.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh fla
timeout 560 python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s 470 \
    --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 \
    --shapes dense_H32_T16384 dense_H64_T8192 dense_H16_T16384 varlen_mixed6_H32 dense_H16_T8192 \
    dense_H32_T8192 dense_H64_T16384 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-200 | tail -34
