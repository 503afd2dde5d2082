# Round 25 call 2 (warm after call 1, whose FlashKDA build and fla install stay in .peer; call 1's
# autotune.tgz in the tree): ours, fla and upstream FlashKDA (lower-bound setting) at H64 T16384, on the
# varlen batch (ours also at KDADBG_REC_U_AHEAD=1, pre-gated) and at H64 T65536; taps on/off pairs at
# pre-gated H16 T16384 and lower-bound H32 T16384.
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site" FLA_FLASH_KDA=0 PYTHONUNBUFFERED=1
. .peer/fk_env.sh
export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache TRITON_CACHE_AUTOTUNING=1
mkdir -p $TRITON_CACHE_DIR
for f in docs/gpu/*/call*/autotune.tgz; do tar xzf $f -C $TRITON_CACHE_DIR; done
timeout $((560 - SECONDS)) python3 benchmarks/bench.py --json $OUT/benchmarks.json --budget-s $((470 - SECONDS)) \
    --commit $COMMIT --peers fla,flashkda --shapes dense_H64_T16384 varlen_mixed6_H32 dense_H16_T16384 \
    dense_H32_T16384 dense_H64_T65536 --ab KDADBG_REC_U_AHEAD=1 --ab-settings pregated \
    --taps-at pregated:dense_H16_T16384 lower_bound:dense_H32_T16384 > $OUT/bench.log 2>&1
echo "bench exit $?"
(cd $TRITON_CACHE_DIR && find . -name "*.autotune.json" | tar czf $OUT/autotune.tgz -T -)
grep -E "^\[bench\]" $OUT/bench.log | cut -c1-400
