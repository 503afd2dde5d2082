# Round 39 call 1 (no carry; bash docs/gpu/round39/call1/command.sh): the GPU tests after this round's change of
# diff's dataflow order (the backward walks each sequence from its last chunk, each chunk's recurrence then its
# prepare): the planted faults at model size first (named at their tap and chunk), then the quiet diffs and the
# rest of tests/test_kernels_gpu.py, under one time limit.
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 500 python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels_gpu.py \
    -k "planted_fault_is_named or diff_is_quiet" > $W/gpu_tests_diff.log 2>&1
echo "diff tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests_diff.log
timeout $((560 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py \
    -k "not planted_fault_is_named and not diff_is_quiet" > $W/gpu_tests_rest.log 2>&1
echo "other GPU tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests_rest.log
