# Round 46 call 3 (.peer in carry; COMMIT=<sha> bash docs/gpu/round46/call3/command.sh): where the card is an
# H200, round 45 call 1's benchmark with today's kernels (unchanged since d0ed738): the three settings against fla
# at the 10 shapes of issue 23 and the taps pairs; on an H100 nothing (its rows are round 45's).
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
grep -q H200 $W/gpu.txt || { echo "not an H200: nothing run"; exit 0; }
. benchmarks/gpu_env.sh fla
timeout 520 python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s 440 \
    --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 \
    --shapes dense_H32_T16384 dense_H64_T8192 dense_H16_T16384 varlen_mixed6_H32 dense_H16_T8192 \
    dense_H32_T8192 dense_H64_T16384 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-230
