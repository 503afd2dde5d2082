# Round 45 call 2 (.peer in carry; COMMIT=<sha> bash docs/gpu/round45/call2/command.sh; prepared in round 38,
# first run in round 41): upstream FlashKDA built, then the lower-bound setting at the 10 shapes of issue 23
# against fla (safe_gate) and FlashKDA in one process, most asked-for shapes first, under a budget.
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh fla
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 170 bash benchmarks/build_flashkda.sh upstream .peer > $W/flashkda_build.log 2>&1
tail -1 $W/flashkda_build.log > .peer/fk_env.sh
echo "flashkda built at $SECONDS s"; tail -1 $W/flashkda_build.log | cut -c1-200
. .peer/fk_env.sh
timeout $((450 - SECONDS)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((390 - SECONDS)) \
    --commit $COMMIT --peers fla,flashkda --settings lower_bound --taps-at \
    --shapes dense_H32_T16384 dense_H64_T8192 dense_H16_T16384 varlen_mixed6_H32 dense_H16_T8192 dense_H32_T8192 \
    dense_H64_T16384 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-700
