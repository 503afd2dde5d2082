# Round 51 call 5 (.peer in carry; COMMIT=<sha> bash docs/gpu/round51/call5/command.sh): on an H200, issue 23's
# benchmark at this round's kernels in the lower-bound setting (the one whose forward + backward target the H200
# missed at 616f785) against fla at the shapes it missed (H32 T16384, H64 T8192, the varlen batch, H64 T16384;
# about 170 s of device time was left), with its taps pair; on an H100 (whose benchmark is calls 2 and 3) the
# GPU kernel tests on CUDA.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
if grep -q H200 $W/gpu.txt; then
  . benchmarks/gpu_env.sh fla
  timeout 165 python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s 110 \
      --commit $COMMIT --peers fla --settings lower_bound --taps-at lower_bound:dense_H32_T16384 \
      --shapes dense_H32_T16384 dense_H64_T8192 varlen_mixed6_H32 dense_H64_T16384 > $W/bench.log 2>&1
  echo "bench exit $? at $SECONDS s"
  grep -E "^\[bench\] " $W/bench.log | cut -c1-200 | tail -8
else
  TESTS_TIMEOUT_S=150 TESTS_SELECT='tests/test_kernels_gpu.py' bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
  echo "gpu_check exit $? at $SECONDS s"
  grep -E "passed|failed|error" $W/gpu_tests.log | tail -5 | cut -c1-300
  grep -E "^FAILED|^ERROR" $W/gpu_tests.log | head -20 | cut -c1-300
fi
