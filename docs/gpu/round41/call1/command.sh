# Round 41 call 1 (no carry; bash docs/gpu/round41/call1/command.sh), prepared in round 39 as its call 2 after call 1 failed two GPU tests: the carried-in
# split's rows on the GPU against its cells on the CPU (compare/carried.py, a device mismatch in every diff on CUDA
# with a gate), and test_large_against_reference judging dA_log by its bare tolerance (now as run judges it, with the
# carried-in rule). The diff tests again, then the large cases.
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py \
    -k "planted_fault_is_named or diff_is_quiet" > $W/gpu_tests_diff.log 2>&1
echo "diff tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests_diff.log
timeout $((560 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py \
    -k "large_against_reference" > $W/gpu_tests_large.log 2>&1
echo "large tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests_large.log
