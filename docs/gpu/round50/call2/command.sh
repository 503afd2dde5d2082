# Round 50 call 2 (carry .out/kernels_old: `git archive 6afc77d kernels`): call 1's taps pairs were slower with
# this round's kernels (the taps-on call bound by the host: 4.498 ms of host time per forward + backward). Now
# the fills' regions go to the kernels as scalars (no table copied per call, no loop over pieces). The taps pairs
# with this round's kernels and 6afc77d's, one process each on one GPU, then the CUDA test of the taps' bits.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh
link() { mkdir -p /tmp/kp_$1 && ln -sfn "$2" /tmp/kp_$1/kdadbg_kernels; }
link new "$PWD/kernels"; link old "$PWD/.out/kernels_old"
for v in new old; do
  PYTHONPATH="$PWD:/tmp/kp_$v" timeout 70 python3 benchmarks/bench.py --json $W/taps_$v.json --budget-s 50 \
      --commit $v --peers none --settings pregated,lower_bound --shapes dense_H16_T16384 dense_H32_T16384 \
      --taps-at pregated:dense_H16_T16384 lower_bound:dense_H32_T16384 > $W/taps_$v.log 2>&1
  echo "taps $v exit $? at $SECONDS s"; grep -E "taps on" $W/taps_$v.log | cut -c1-200
done
timeout $((150 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py -x -k "taps_do_not_change" \
    > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests.log | cut -c1-300
