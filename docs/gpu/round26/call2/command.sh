# Round 26 call 2 (warm after call 1, FlashKDA built there; COMMIT=<sha> bash docs/gpu/round26/call2/command.sh):
# (a) pre-gated H16 T16384 with fla and the taps pairs there; (b) the lower-bound setting at every shape with
# fla and FlashKDA: ours (training forward, chunk 64 and 16), ours_infer (no_grad: no S, U, fp32 qn, kn
# stored) at chunk 64 and 16, FlashKDA's forward, and the taps pairs at H32 T16384. The taps pairs time
# a02d741's one flat fill and this round's one-launch fills of the aliased windows.
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
python3 -m pip install -q --no-index --no-deps --target $PWD/.peer/site .peer/fla_core-*.whl
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site" FLA_FLASH_KDA=0 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache TRITON_CACHE_AUTOTUNING=1
mkdir -p $TRITON_CACHE_DIR
for f in docs/gpu/*/call*/autotune.tgz; do tar xzf $f -C $TRITON_CACHE_DIR; done
mkdir -p $OUT/a $OUT/b $OUT/c
timeout 120 python3 benchmarks/bench.py --json $OUT/a/benchmarks.json --budget-s 90 --commit $COMMIT --peers fla \
    --settings pregated --shapes dense_H16_T16384 --taps-at pregated:dense_H16_T16384 > $OUT/a/bench.log 2>&1
echo "bench a exit $?"
. .peer/fk_env.sh
timeout $((570 - SECONDS)) python3 benchmarks/bench.py --json $OUT/b/benchmarks.json --budget-s $((500 - SECONDS)) \
    --commit $COMMIT --peers fla,flashkda --settings lower_bound \
    --shapes dense_H16_T16384 dense_H32_T16384 dense_H64_T8192 dense_H16_T8192 dense_H32_T8192 dense_H64_T16384 \
             varlen_mixed6_H32 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 \
    --taps-at lower_bound:dense_H32_T16384 > $OUT/b/bench.log 2>&1
echo "bench b exit $?"
grep -E "^\[bench\]" $OUT/a/bench.log $OUT/b/bench.log | cut -c1-400
# (c) the inference forward's row scales against fp32 qn, kn (KDADBG_INFER_ROWSCALE=0), in what time is left
timeout $((590 - SECONDS)) python3 benchmarks/bench.py --json $OUT/c/benchmarks.json --budget-s $((560 - SECONDS)) \
    --commit $COMMIT --peers flashkda --settings lower_bound --shapes dense_H32_T16384 dense_H64_T16384 \
    --ab KDADBG_INFER_ROWSCALE=0 --ab-settings lower_bound > $OUT/c/bench.log 2>&1
echo "bench c exit $?"
grep -E "^\[bench\]" $OUT/c/bench.log | cut -c1-400
