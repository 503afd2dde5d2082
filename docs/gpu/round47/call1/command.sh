# Round 47 call 1 (.peer in carry; COMMIT=<sha> bash docs/gpu/round47/call1/command.sh): on an H200, round 46
# call 3's benchmark (the three settings against fla at the 10 shapes of issue 23, the taps pairs); on an H100
# (whose benchmark rows are round 45's) the taps' cost launch by launch: kernel_profile.py taps off and every
# tap on over chunks [0, 64), lower-bound H32 T16384 and pre-gated H16 T16384.
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
  for s in "lower_bound 32" "pregated 16"; do
    set -- $s
    for tw in 0 64; do
      timeout 200 python3 benchmarks/kernel_profile.py --H $2 --T 16384 --settings $1 --taps-window $tw \
          --per-launch --json $W/profile_$1_H$2_taps$tw.json > $W/profile_$1_H$2_taps$tw.log 2>&1
      echo "$1 H$2 taps $tw exit $? at $SECONDS s"
    done
  done
  tail -n 40 $W/profile_lower_bound_H32_taps64.log
fi
