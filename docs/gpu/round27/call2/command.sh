# Round 27 call 2 (a fresh machine, .peer in carry; COMMIT=<sha> bash docs/gpu/round27/call2/command.sh):
# upstream FlashKDA built in the background while the GPU suite runs (the token kernel's new launch with the
# gate or l2norm in the kernel: K blocks in programs of their own, 8 warps); then bench.py's lower-bound
# setting at every shape with fla and FlashKDA, the old launch (KSPLIT=0, 4 warps) beside it, the taps pairs
# at H32 T16384; then the softplus setting with fla as far as the time goes. Written to $W, packed in one
# tarball in $OUT (the tool returns a limited number of files).
export PYTHONUNBUFFERED=1
W=/tmp/call2; mkdir -p $W/lb $W/sp
(bash benchmarks/build_flashkda.sh upstream .peer > $W/flashkda_build.log 2>&1; tail -1 $W/flashkda_build.log > .peer/fk_env.sh) &
fk=$!
TESTS_WORKERS=8 TESTS_TIMEOUT_S=230 OUT=$W bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "FAILED|ERROR" $W/gpu_tests.log | head -10 | cut -c1-300
wait $fk; echo "flashkda built at $SECONDS s"; tail -1 $W/flashkda_build.log | cut -c1-200
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site" FLA_FLASH_KDA=0
export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache TRITON_CACHE_AUTOTUNING=1
mkdir -p $TRITON_CACHE_DIR
for f in docs/gpu/*/call*/autotune.tgz; do tar xzf $f -C $TRITON_CACHE_DIR; done
. .peer/fk_env.sh
OLD=KDADBG_PREP_KSPLIT=0,KDADBG_PREP_WARPS=4
timeout $((580 - SECONDS)) python3 benchmarks/bench.py --json $W/lb/benchmarks.json --budget-s $((470 - SECONDS)) \
    --commit $COMMIT --peers fla,flashkda --settings lower_bound --ab $OLD --ab-settings lower_bound \
    --taps-at lower_bound:dense_H32_T16384 > $W/lb/bench.log 2>&1
echo "bench lower_bound exit $? at $SECONDS s"
timeout $((585 - SECONDS)) python3 benchmarks/bench.py --json $W/sp/benchmarks.json --budget-s $((540 - SECONDS)) \
    --commit $COMMIT --peers fla --settings softplus --ab $OLD --ab-settings softplus --taps-at > $W/sp/bench.log 2>&1
echo "bench softplus exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/lb/bench.log $W/sp/bench.log | sed 's#/tmp/call2/##' | cut -c1-420
tar czf $OUT/call2.tgz -C $W . && echo "packed $(ls $W | wc -l) entries"
