# Round 30 call 8 (.peer in carry; COMMIT=<sha> bash docs/gpu/round30/call8/command.sh): upstream
# FlashKDA's forward against ours (the training forward, and with no backward to follow at chunks 64 and
# 16) in its setting, lower-bound gate, K = V = 128, at H16 / H32 T16384 and H64 T8192, with round 30's
# forward launch (bench/, written to $OUT as it runs in case the call is cut).
export PYTHONUNBUFFERED=1
W=/tmp/call8; mkdir -p $W $OUT/bench
bash benchmarks/build_flashkda.sh upstream .peer > $OUT/bench/flashkda_build.log 2>&1
tail -1 $OUT/bench/flashkda_build.log > .peer/fk_env.sh
echo "flashkda built at $SECONDS s"; tail -1 $OUT/bench/flashkda_build.log | cut -c1-200
. benchmarks/gpu_env.sh
cp $W/env.txt $OUT/bench/
. .peer/fk_env.sh
timeout $((400 - SECONDS)) python3 benchmarks/bench.py --json $OUT/bench/benchmarks.json --budget-s $((330 - SECONDS)) \
    --commit $COMMIT --peers flashkda --settings lower_bound --shapes dense_H16_T16384 dense_H32_T16384 \
    dense_H64_T8192 --taps-at > $OUT/bench/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $OUT/bench/bench.log | cut -c1-400
