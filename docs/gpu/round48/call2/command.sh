# Round 48 call 2 (.peer in carry; COMMIT=<sha> bash docs/gpu/round48/call2/command.sh): on an H100, the CUDA
# tests that call 1 (round 47's command) cut at its 170 s cap, with the other taps tests of the kernels and this
# round's dA_log/ddt_bias sums that cannot be checked (run and diff on CUDA tensors), at 4 workers; on an H200,
# round 47 call 1's command, which there runs issue 23's benchmark (the three settings against fla at the 10
# shapes, taps pairs).
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then
  bash docs/gpu/round47/call1/command.sh
else
  TESTS_TIMEOUT_S=480 TESTS_WORKERS=4 TESTS_SELECT='tests/test_kernels_bwd.py tests/test_kernels_gpu.py tests/test_diff.py tests/test_run.py -k "taps or p_loop_sums or cannot_be_checked or carried"' \
      bash benchmarks/gpu_check.sh tests
  echo "tests exit $? at $SECONDS s"; tail -5 $OUT/gpu_tests.log | cut -c1-300
fi
