# Round 24 call 2 (commit 6d1d903, the machine of call 1: upstream FlashKDA built there in .peer/build-upstream,
# .peer not carried again). A: ours against upstream FlashKDA's forward in its setting (lower-bound gate) at
# every shape of the issue. B: ours and fla in the three settings, default order, as far as the time goes
# (fla's autotune results of earlier calls unpacked first; this call's saved as autotune.tgz).
source .peer/fk_env.sh
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site:$PYTHONPATH" FLA_FLASH_KDA=0 PYTHONUNBUFFERED=1
python3 benchmarks/bench.py --commit 6d1d903 --peers flashkda --settings lower_bound --taps-at \
    --shapes dense_H16_T8192 dense_H16_T16384 dense_H16_T65536 dense_H32_T8192 dense_H32_T16384 dense_H32_T65536 \
             dense_H64_T8192 dense_H64_T16384 dense_H64_T65536 varlen_mixed6_H32 \
    --budget-s 170 --json $OUT/benchmarks_flashkda.json 2>&1 | grep -v -e Warning -e _warn_once > $OUT/bench_flashkda.log
tail -25 $OUT/bench_flashkda.log
BENCH_BUDGET_S=$((480 - SECONDS)) BENCH_ARGS="--commit 6d1d903 --peers fla" OUT=$OUT timeout $((585 - SECONDS)) \
    bash benchmarks/gpu_check.sh bench > /dev/null 2>&1
tail -45 $OUT/bench.log
