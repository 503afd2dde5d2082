# Round 34 call 6 (.peer in carry; COMMIT=<sha> bash docs/gpu/round34/call6/command.sh): the current numbers
# against fla with the token kernel's loads ahead and unrolled loops and the K pass's L2 prefetch (the defaults
# since round 34 calls 3-5), the three settings at H32 / H16 T16384, H64 T8192 and the varlen batch, the taps
# pairs; then, as far as the time allows, the shapes last timed in round 27 (T8192, H64 T16384, T65536).
W=$OUT
. benchmarks/gpu_env.sh fla
timeout $((585 - SECONDS)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((470 - SECONDS)) \
    --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
    --shapes dense_H32_T16384 dense_H16_T16384 dense_H64_T8192 varlen_mixed6_H32 dense_H16_T8192 dense_H32_T8192 \
    dense_H64_T16384 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"; ls -la $W/benchmarks.json
grep -E "^\[bench\]" $W/bench.log | cut -c1-400
