# Round 50 call 2 (carry .out/kernels_old: `git archive 6afc77d kernels`): call 1's taps pairs were slower with
# this round's kernels (the host-bound taps-on call: host 4.498 ms per forward + backward). Now the fills'
# regions go to the kernels as scalars (no table copied per call). The taps pairs with this round's kernels and
# 6afc77d's, then both launch by launch with the host's profile (pre-gated H16 T16384, taps on), then the CUDA
# tests of the taps' bits and fills.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh
link() { mkdir -p /tmp/kp_$1 && ln -sfn "$2" /tmp/kp_$1/kdadbg_kernels; }
link new "$PWD/kernels"; link old "$PWD/.out/kernels_old"
for v in new old; do
  PYTHONPATH="$PWD:/tmp/kp_$v" timeout 75 python3 benchmarks/bench.py --json $W/taps_$v.json --budget-s 60 \
      --commit $v --peers none --settings pregated,lower_bound --shapes dense_H16_T16384 dense_H32_T16384 \
      --taps-at pregated:dense_H16_T16384 lower_bound:dense_H32_T16384 > $W/taps_$v.log 2>&1
  echo "taps $v exit $? at $SECONDS s"; grep -E "taps on" $W/taps_$v.log | cut -c1-200
done
for v in new old; do
  PYTHONPATH="$PWD:/tmp/kp_$v" timeout 35 python3 benchmarks/kernel_profile.py --H 16 --T 16384 --settings pregated \
      --taps-window 64 --per-launch --host-profile 25 > $W/profile_$v.log 2>&1
  echo "profile $v exit $? at $SECONDS s"; grep -E "^ours" $W/profile_$v.log | cut -c1-330
done
timeout $((195 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py tests/test_kernels_bwd.py \
    tests/test_kernels.py -x -k "taps_do_not_change or nan_filled or aliased_taps or fill" > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests.log | cut -c1-300
