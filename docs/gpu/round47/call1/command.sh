# Round 47 call 1 (.peer in carry; COMMIT=<sha> bash docs/gpu/round47/call1/command.sh): on an H200, round 46
# call 3's benchmark (the three settings against fla at the 10 shapes of issue 23, the taps pairs); on an H100
# (whose benchmark rows are round 45's): the CUDA tests of the K pass's dqd/dkd taps (now from the P loop's
# sums) and of the taps' bits, bench.py's taps pairs (ours alone) at pre-gated H16 T16384 and lower-bound H32
# T16384, and the taps' cost launch by launch (kernel_profile.py, lower-bound H32 T16384, taps off and on).
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
if grep -q H200 $W/gpu.txt; then
  . benchmarks/gpu_env.sh fla
  timeout 520 python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s 440 \
      --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
      --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 \
      --shapes dense_H32_T16384 dense_H64_T8192 dense_H16_T16384 varlen_mixed6_H32 dense_H16_T8192 \
      dense_H32_T8192 dense_H64_T16384 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 > $W/bench.log 2>&1
  echo "bench exit $? at $SECONDS s"
  grep -E "^\[bench\]" $W/bench.log | cut -c1-230
else
  . benchmarks/gpu_env.sh
  timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_bwd.py tests/test_kernels_gpu.py \
      -k "p_loop_sums or taps_same_bits or nan_filled or taps_do_not_change" > $W/gpu_tests.log 2>&1
  echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests.log | cut -c1-300
  mkdir -p $W/taps
  timeout 160 python3 benchmarks/bench.py --json $W/taps/benchmarks.json --budget-s 90 --commit $COMMIT --peers none \
      --settings pregated,lower_bound --shapes dense_H16_T16384 dense_H32_T16384 \
      --taps-at pregated:dense_H16_T16384 lower_bound:dense_H32_T16384 > $W/taps/bench.log 2>&1
  echo "taps exit $? at $SECONDS s"; grep -E "^\[bench\] (pregated_dense_H16|lower_bound_dense_H32)" $W/taps/bench.log | cut -c1-300
  for tw in 0 64; do
    timeout $((585 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound \
        --taps-window $tw --per-launch --json $W/profile_taps$tw.json > $W/profile_taps$tw.log 2>&1
    echo "profile taps $tw exit $? at $SECONDS s"
  done
  tail -n 30 $W/profile_taps64.log
fi
