# Round 34 call 7 (no carry; COMMIT=<sha> bash docs/gpu/round34/call7/command.sh): the taps pairs again (call 6
# had pre-gated H16 T16384 at 1.210 / 1.200 / 1.518), ours alone: pre-gated H16 T16384 and lower-bound H32
# T16384 with today's defaults (a/), then pre-gated H16 T16384 with the launch before round 34 (b/:
# PREP_UNROLL=0, PREP_AHEAD=0, DQKG_PREFETCH=0 for the whole process).
. benchmarks/gpu_env.sh
mkdir -p $OUT/a $OUT/b
timeout 100 python3 benchmarks/bench.py --json $OUT/a/benchmarks.json --budget-s 60 --commit $COMMIT --peers none \
    --settings pregated,lower_bound --shapes dense_H16_T16384 dense_H32_T16384 \
    --taps-at pregated:dense_H16_T16384 lower_bound:dense_H32_T16384 > $OUT/a/bench.log 2>&1
echo "a exit $? at $SECONDS s"; grep -E "^\[bench\] (pregated_dense_H16|lower_bound_dense_H32)" $OUT/a/bench.log | cut -c1-300
KDADBG_PREP_UNROLL=0 KDADBG_PREP_AHEAD=0 KDADBG_DQKG_PREFETCH=0 timeout $((175 - SECONDS)) python3 benchmarks/bench.py \
    --json $OUT/b/benchmarks.json --budget-s 10 --commit $COMMIT --peers none --settings pregated \
    --shapes dense_H16_T16384 --taps-at pregated:dense_H16_T16384 > $OUT/b/bench.log 2>&1
echo "b exit $? at $SECONDS s"; grep -E "^\[bench\] pregated_dense_H16" $OUT/b/bench.log | cut -c1-300
