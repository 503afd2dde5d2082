# Round 54 call 7 (no carry; the same H100 as call 6, warm; kernels as 73ea25f, = a471cfc's):
TESTS_SELECT='tests/test_kernels_gpu.py' TESTS_TIMEOUT_S=230 bash benchmarks/gpu_check.sh tests
