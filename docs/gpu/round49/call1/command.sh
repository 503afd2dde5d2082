# Round 49 call 1 (.peer in carry; COMMIT=<sha> bash docs/gpu/round49/call1/command.sh): on an H200, issue 23's
# benchmark at today's kernels (round 47 call 1's: the three settings against fla at the 10 shapes, the taps
# pairs); on an H100: 87d93e0's test on CUDA (`-k cannot_be_checked`), then the taps pairs, ours alone.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
if grep -q H200 $W/gpu.txt; then
  bash docs/gpu/round47/call1/command.sh
else
  TESTS_WORKERS=1 TESTS_SELECT='tests/test_diff.py -k cannot_be_checked' timeout 200 bash benchmarks/gpu_check.sh tests > $W/gpu_tests_check.log 2>&1
  echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests_check.log | cut -c1-300
  ls $W
fi
