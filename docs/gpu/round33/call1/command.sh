# Round 33 call 1 (.peer in carry; COMMIT=<sha> bash docs/gpu/round33/call1/command.sh): upstream FlashKDA's
# forward against ours in its setting (lower-bound gate, K = V = 128) at H16 / H32 T16384 and H64 T8192, at
# the current defaults (fp16 qn, kn in bf16 mode since 51d4891; round 30 call 8 was the last such run).
# Written to $OUT as it runs, in case the call is cut.
export PYTHONUNBUFFERED=1
W=$OUT
timeout 150 bash benchmarks/build_flashkda.sh upstream .peer > $W/flashkda_build.log 2>&1
tail -1 $W/flashkda_build.log > .peer/fk_env.sh
echo "flashkda built at $SECONDS s"; tail -1 $W/flashkda_build.log | cut -c1-200
. benchmarks/gpu_env.sh
. .peer/fk_env.sh
timeout $((290 - SECONDS)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((230 - SECONDS)) \
    --commit $COMMIT --peers flashkda --settings lower_bound --shapes dense_H16_T16384 dense_H32_T16384 \
    dense_H64_T8192 --taps-at > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-400
