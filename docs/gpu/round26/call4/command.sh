# Round 26 call 4 (a fresh machine, .peer in carry; COMMIT=<sha> bash docs/gpu/round26/call4/command.sh):
# call 3 again, its JSON this time (call 3's bench folders did not come back: the device tool returns a
# limited number of files, so this call packs them into one tarball): upstream FlashKDA built first; (a)
# pre-gated H16 T16384 with fla and the taps pairs; (b) the lower-bound setting at every shape with fla and
# FlashKDA, ours_infer at chunk 64 and 16, the taps pairs at H32 T16384.
bash benchmarks/build_flashkda.sh upstream .peer > $OUT/flashkda_build.log 2>&1; tail -1 $OUT/flashkda_build.log > .peer/fk_env.sh
echo "build $SECONDS s"
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
python3 -m pip install -q --no-index --no-deps --target $PWD/.peer/site .peer/fla_core-*.whl
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site" FLA_FLASH_KDA=0 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache TRITON_CACHE_AUTOTUNING=1
R=/tmp/round26_call4
mkdir -p $TRITON_CACHE_DIR $R/a $R/b
for f in docs/gpu/*/call*/autotune.tgz; do tar xzf $f -C $TRITON_CACHE_DIR; done
{ nvidia-smi; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > $R/env.txt 2>&1
tail -3 $OUT/flashkda_build.log > $R/flashkda_build_tail.txt
timeout 120 python3 benchmarks/bench.py --json $R/a/benchmarks.json --budget-s 90 --commit $COMMIT --peers fla \
    --settings pregated --shapes dense_H16_T16384 --taps-at pregated:dense_H16_T16384 > $R/a/bench.log 2>&1
echo "bench a exit $?"
. .peer/fk_env.sh
timeout $((560 - SECONDS)) python3 benchmarks/bench.py --json $R/b/benchmarks.json --budget-s $((500 - SECONDS)) \
    --commit $COMMIT --peers fla,flashkda --settings lower_bound \
    --shapes dense_H16_T16384 dense_H32_T16384 dense_H64_T8192 dense_H16_T8192 dense_H32_T8192 dense_H64_T16384 \
             varlen_mixed6_H32 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 \
    --taps-at lower_bound:dense_H32_T16384 > $R/b/bench.log 2>&1
echo "bench b exit $?"
tar czf $OUT/round26_call4.tgz -C /tmp round26_call4
grep -E "^\[bench\]" $R/a/bench.log $R/b/bench.log | cut -c1-200
