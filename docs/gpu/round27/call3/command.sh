# Round 27 call 3 (a fresh machine, .peer in carry; COMMIT=<sha> bash docs/gpu/round27/call3/command.sh):
# upstream FlashKDA built in the background while the token kernel's split-K bits test runs on CUDA at 8
# warps (call 2 compared the split launch at 8 warps with the walk at 4, whose bits differ); then bench.py's
# pre-gated setting at every shape with fla and the taps pairs at H16 T16384; then the rows call 2 timed
# while its killed test workers may still have held the GPU (lower-bound varlen and H16 T8192, softplus
# H16 T8192). Written to $W, packed in one tarball in $OUT.
export PYTHONUNBUFFERED=1
W=/tmp/call3; mkdir -p $W/pg $W/lb $W/sp
(bash benchmarks/build_flashkda.sh upstream .peer > $W/flashkda_build.log 2>&1; tail -1 $W/flashkda_build.log > .peer/fk_env.sh) &
fk=$!
TESTS_WORKERS=4 TESTS_TIMEOUT_S=120 OUT=$W TESTS_SELECT='tests/test_kernels.py -k "k_blocks_in_programs"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "FAILED|ERROR|^E  .*Error" $W/gpu_tests.log | head -10 | cut -c1-300
pkill -f "pytest" ; sleep 1
wait $fk; echo "flashkda built at $SECONDS s"; tail -1 $W/flashkda_build.log | cut -c1-200
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site" FLA_FLASH_KDA=0
export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache TRITON_CACHE_AUTOTUNING=1
mkdir -p $TRITON_CACHE_DIR
for f in docs/gpu/*/call*/autotune.tgz; do tar xzf $f -C $TRITON_CACHE_DIR; done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > $W/gpu_apps_before_bench.txt 2>&1
timeout $((400 - SECONDS)) python3 benchmarks/bench.py --json $W/pg/benchmarks.json --budget-s $((330 - SECONDS)) \
    --commit $COMMIT --peers fla --settings pregated --taps-at pregated:dense_H16_T16384 > $W/pg/bench.log 2>&1
echo "bench pregated exit $? at $SECONDS s"
. .peer/fk_env.sh
timeout $((470 - SECONDS)) python3 benchmarks/bench.py --json $W/lb/benchmarks.json --budget-s $((440 - SECONDS)) \
    --commit $COMMIT --peers fla,flashkda --settings lower_bound --shapes varlen_mixed6_H32 dense_H16_T8192 \
    --ab KDADBG_PREP_KSPLIT=0,KDADBG_PREP_WARPS=4 --ab-settings lower_bound --taps-at > $W/lb/bench.log 2>&1
echo "bench lower_bound exit $? at $SECONDS s"
timeout $((500 - SECONDS)) python3 benchmarks/bench.py --json $W/sp/benchmarks.json --budget-s $((480 - SECONDS)) \
    --commit $COMMIT --peers fla --settings softplus --shapes dense_H16_T8192 \
    --ab KDADBG_PREP_KSPLIT=0,KDADBG_PREP_WARPS=4 --ab-settings softplus --taps-at > $W/sp/bench.log 2>&1
echo "bench softplus exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/pg/bench.log $W/lb/bench.log $W/sp/bench.log | sed 's#/tmp/call3/##' | cut -c1-420
tar czf $OUT/call3.tgz -C $W . && echo "packed $(ls $W | wc -l) entries"
