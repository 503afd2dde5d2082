# Round 51 call 4 (no carry; bash docs/gpu/round51/call4/command.sh): the GPU-facing tests on CUDA
# (benchmarks/gpu_check.sh's default selection) with U and dU stored in bf16, their taps stored by the state
# passes.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
TESTS_TIMEOUT_S=560 bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "gpu_check exit $? at $SECONDS s"
grep -E "passed|failed|error" $W/gpu_tests.log | tail -5 | cut -c1-300
grep -E "^FAILED|^ERROR" $W/gpu_tests.log | head -20 | cut -c1-300
