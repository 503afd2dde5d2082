# Round 22, call 7 (thirteenth session; the code of calls 5 and 6). From the repo root on the device
# machine, no carry. The GPU tests on the final kernels, as many as the device time left allows: every
# test of test_kernels_gpu.py (the large cases in both precisions with every tap, the taps bits test and
# repeat runs, the bf16 case table), then the backward's tests on CUDA that touch the K pass's taps.
set -u
R=$OUT/r; mkdir -p "$R"
mkdir -p /tmp/kdadbg_path && ln -sfn "$PWD/kernels" /tmp/kdadbg_path/kdadbg_kernels
export PYTHONPATH="$PWD:/tmp/kdadbg_path" PYTHONUNBUFFERED=1
timeout 230 python3 -m pytest -v -p no:cacheprovider --durations=8 tests/test_kernels_gpu.py > "$R/gpu_tests.log" 2>&1
echo "test_kernels_gpu.py: exit $?"; tail -3 "$R/gpu_tests.log"
timeout $((320 - SECONDS)) python3 -m pytest -v -p no:cacheprovider tests/test_kernels_bwd.py \
    -k "golden or same_bits or block_products or tame or nan_filled" > "$R/gpu_tests_bwd.log" 2>&1
echo "test_kernels_bwd.py subset: exit $?"; tail -3 "$R/gpu_tests_bwd.log"
tar czf "$OUT/call7.tgz" -C "$R" .
