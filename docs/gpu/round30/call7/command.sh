# Round 30 call 7 (.peer in carry; COMMIT=<sha> bash docs/gpu/round30/call7/command.sh): the new forward launch and
# the finish kernel in one pass, against fla in three settings at H16 / H32 T16384, H64 T8192 and the varlen batch, and the
# taps-on pairs (bench/).
W=/tmp/call7; mkdir -p $W $OUT/bench
. benchmarks/gpu_env.sh fla
timeout $((585 - SECONDS)) python3 benchmarks/bench.py --json $OUT/bench/benchmarks.json --budget-s $((545 - SECONDS)) \
    --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
    --shapes dense_H32_T16384 dense_H16_T16384 dense_H64_T8192 varlen_mixed6_H32 \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 > $OUT/bench/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
cp $W/env.txt $OUT/bench/
grep -E "^\[bench\]" $OUT/bench/bench.log | cut -c1-300
