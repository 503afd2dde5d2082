# Round 32 call 3 (.peer in carry; COMMIT=<sha> bash docs/gpu/round32/call3/command.sh): the benchmark against fla at
# the shapes call 2 did not time (H16 / H32 T8192, H64 T16384, T65536 at H16 / H32 / H64), the three settings,
# with fp16 qn, kn (PREP_QK_LOWP=2, the default since 51d4891) (benchmarks.json, bench.log).
W=$OUT
. benchmarks/gpu_env.sh fla
timeout 520 python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s 490 \
    --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
    --shapes dense_H16_T8192 dense_H32_T8192 dense_H64_T16384 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 \
    --taps-at > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"; ls -la $W/benchmarks.json
grep -E "^\[bench\]" $W/bench.log | cut -c1-300
