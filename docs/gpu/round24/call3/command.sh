# Round 24 call 3 (commit 6d1d903 kernels, .peer in carry; call 2 found a fresh machine, without fla or
# FlashKDA, and timed ours alone). Upstream FlashKDA builds in the background while ours and fla run in the
# three settings (fla's cached autotune results first); then ours against FlashKDA's forward (lower-bound
# gate) at every shape of the issue.
(bash benchmarks/build_flashkda.sh upstream .peer > $OUT/flashkda_build.log 2>&1; tail -1 $OUT/flashkda_build.log > .peer/fk_env.sh) &
BENCH_BUDGET_S=330 BENCH_ARGS="--commit 6d1d903 --peers fla --shapes dense_H16_T16384 dense_H32_T16384 varlen_mixed6_H32 dense_H16_T8192 dense_H64_T8192" \
    OUT=$OUT timeout 420 bash benchmarks/gpu_check.sh bench > /dev/null 2>&1
tail -30 $OUT/bench.log
wait
source .peer/fk_env.sh
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site:$PYTHONPATH" FLA_FLASH_KDA=0 PYTHONUNBUFFERED=1
python3 benchmarks/bench.py --commit 6d1d903 --peers flashkda --settings lower_bound --taps-at \
    --shapes dense_H16_T8192 dense_H16_T16384 dense_H32_T8192 dense_H32_T16384 dense_H64_T8192 dense_H64_T16384 \
             varlen_mixed6_H32 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 \
    --budget-s $((560 - SECONDS)) --json $OUT/benchmarks_flashkda.json 2>&1 | grep -v -e Warning -e _warn_once > $OUT/bench_flashkda.log
tail -16 $OUT/bench_flashkda.log
