# Round 60 call 1 (.peer in carry; COMMIT=<sha> LIMIT=<seconds> bash docs/gpu/round60/call1.sh): the CUDA test of
# the fused state pass (KDADBG_FWD_FUSE_WU=1 against =0 at chunks 16, 32, 64 x V blocks 16, 32, 64, and K = V = 64) while
# upstream FlashKDA builds on the CPUs; then, in the time left, the lower-bound bench at H16 and H32 T16384 and the
# varlen batch against fla and FlashKDA with FWD_FUSE_WU=1 (training and inference) and =2 (inference only)
# beside the default.
# (gpu_env.sh sets W and PYTHONUNBUFFERED, and writes env.txt: the GPU, driver, torch and triton.)
LIMIT=${LIMIT:-480}
. benchmarks/gpu_env.sh fla
flashkda_start
timeout ${TEST_LIMIT:-200} python3 -m pytest -q -rA tests/test_kernels_gpu.py -k fused_state > $W/test.log 2>&1
echo "test exit $? at $SECONDS s"; tail -15 $W/test.log | cut -c1-300
flashkda_ready
if [ $((LIMIT - SECONDS)) -gt 90 ]; then
    timeout $((LIMIT - SECONDS - 10)) python3 benchmarks/bench.py --json $W/benchmarks.json \
        --budget-s $((LIMIT - SECONDS - 60)) --commit $COMMIT --peers fla,flashkda --settings lower_bound \
        --ab KDADBG_FWD_FUSE_WU=1 --ab KDADBG_FWD_FUSE_WU=2 --ab-settings lower_bound \
        --shapes ${SHAPES:-dense_H32_T16384 dense_H16_T16384 varlen_mixed6_H32} > $W/bench.log 2>&1
    echo "bench exit $? at $SECONDS s"
    grep -E "^\[bench\]" $W/bench.log | cut -c1-330 | tail -30
fi
