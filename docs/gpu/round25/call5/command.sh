# Round 25 call 5 (warm after call 4, nothing else running: call 4's T8192 runs shared the CPUs with the
# FlashKDA build): ours and fla at H16 T8192 and T16384 in the three settings, ours again at
# KDADBG_REC_U_AHEAD=0 and KDADBG_REC_BV=32 (pre-gated), taps pairs at pre-gated H16 T16384.
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site" FLA_FLASH_KDA=0 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache TRITON_CACHE_AUTOTUNING=1
timeout 200 python3 benchmarks/bench.py --json $OUT/benchmarks.json --budget-s 150 --commit $COMMIT --peers fla \
    --shapes dense_H16_T8192 dense_H16_T16384 --ab KDADBG_REC_U_AHEAD=0 --ab KDADBG_REC_BV=32 --ab-settings pregated \
    --taps-at pregated:dense_H16_T16384 > $OUT/bench.log 2>&1
echo "bench exit $?"
grep -E "^\[bench\]" $OUT/bench.log | cut -c1-330
