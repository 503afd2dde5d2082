# Round 25 call 4 (a fresh machine, .peer in carry; COMMIT=<sha> bash docs/gpu/round25/call4/command.sh):
# the shapes calls 1-2 left, at the same commit: (a) ours and fla, pre-gated and softplus, at H16/H32 T8192
# and T65536, and at H64 T8192, ours again at KDADBG_REC_U_AHEAD=0 (the default before 4e828e0: u not loaded ahead
# at 16 columns) and KDADBG_REC_BV=32 (pre-gated);
# (b) once upstream FlashKDA is built (in the background during a), the lower-bound setting with fla and
# FlashKDA at H64 T8192 and at those four shapes. fla's autotune results from calls 1-2 are unpacked first.
(bash benchmarks/build_flashkda.sh upstream .peer > $OUT/flashkda_build.log 2>&1; tail -1 $OUT/flashkda_build.log > .peer/fk_env.sh) &
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
python3 -m pip install -q --no-index --no-deps --target $PWD/.peer/site .peer/fla_core-*.whl
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site" FLA_FLASH_KDA=0 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache TRITON_CACHE_AUTOTUNING=1
mkdir -p $TRITON_CACHE_DIR $OUT/a $OUT/b
for f in docs/gpu/*/call*/autotune.tgz; do tar xzf $f -C $TRITON_CACHE_DIR; done
{ nvidia-smi; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > $OUT/env.txt 2>&1
S="dense_H16_T8192 dense_H32_T8192 dense_H16_T65536 dense_H32_T65536"
timeout 280 python3 benchmarks/bench.py --json $OUT/a/benchmarks.json --budget-s 230 --commit $COMMIT --peers fla \
    --settings pregated,softplus --shapes dense_H64_T8192 $S \
    --ab KDADBG_REC_U_AHEAD=0 --ab KDADBG_REC_BV=32 --ab-settings pregated > $OUT/a/bench.log 2>&1
echo "bench a exit $?"
wait
. .peer/fk_env.sh
timeout $((480 - SECONDS)) python3 benchmarks/bench.py --json $OUT/b/benchmarks.json --budget-s $((430 - SECONDS)) \
    --commit $COMMIT --peers fla,flashkda --settings lower_bound --shapes dense_H64_T8192 $S > $OUT/b/bench.log 2>&1
echo "bench b exit $?"
grep -E "^\[bench\]" $OUT/a/bench.log $OUT/b/bench.log | cut -c1-330
tail -3 $OUT/flashkda_build.log > $OUT/flashkda_build_tail.txt
# the new bits test on CUDA, in what time is left
timeout $((585 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k u_loaded_ahead > $OUT/gpu_tests.log 2>&1
tail -2 $OUT/gpu_tests.log
