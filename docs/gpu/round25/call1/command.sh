# Round 25 call 1 (.peer in carry; COMMIT=<sha> bash docs/gpu/round25/call1/command.sh): upstream FlashKDA
# built in the background for the next call; ours and fla (its first H64 calls autotune: their first-call
# seconds are recorded) at H64 T8192 and T16384 in the three settings and on the varlen batch, with ours
# again at KDADBG_REC_U_AHEAD=1 in the pre-gated setting (the stage plan keeps u one step ahead off at 64
# columns since e961bca). bench.py under its own timeout, so fla's autotune results are saved either way.
(bash benchmarks/build_flashkda.sh upstream .peer > $OUT/flashkda_build.log 2>&1; tail -1 $OUT/flashkda_build.log > .peer/fk_env.sh) &
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
python3 -m pip install -q --no-index --no-deps --target $PWD/.peer/site .peer/fla_core-*.whl
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site" FLA_FLASH_KDA=0 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache TRITON_CACHE_AUTOTUNING=1
mkdir -p $TRITON_CACHE_DIR
for f in docs/gpu/*/call*/autotune.tgz; do tar xzf $f -C $TRITON_CACHE_DIR; done
{ nvidia-smi; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > $OUT/env.txt 2>&1
timeout $((545 - SECONDS)) python3 benchmarks/bench.py --json $OUT/benchmarks.json --budget-s $((430 - SECONDS)) \
    --commit $COMMIT --peers fla --shapes dense_H64_T8192 dense_H64_T16384 varlen_mixed6_H32 \
    --ab KDADBG_REC_U_AHEAD=1 --ab-settings pregated > $OUT/bench.log 2>&1
echo "bench exit $?"
(cd $TRITON_CACHE_DIR && find . -name "*.autotune.json" | tar czf $OUT/autotune.tgz -T -)
grep -E "^\[bench\]" $OUT/bench.log | cut -c1-300
tail -2 $OUT/flashkda_build.log; cat .peer/fk_env.sh 2>/dev/null | cut -c1-200
