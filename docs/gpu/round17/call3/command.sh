# Round 17, call 3 (run from the repo root on the device machine): the state passes launch the longest
# sequences first (common.state_grid) against the given order, on the varlen batch, with the stage
# times at H16/H32 for the record; then the GPU tests: test_kernels_gpu.py and the large cases of the
# forward and the combined call.
set -u
VARIANTS=benchmarks/variants_round17c.txt timeout 200 bash benchmarks/gpu_check.sh stages 2>&1 | tail -8
TESTS_TIMEOUT_S=330 TESTS_SELECT="tests/test_kernels_gpu.py tests/test_kernels_fwd.py tests/test_kernels.py -k gpu" \
    bash benchmarks/gpu_check.sh tests 2>&1 | tail -8
