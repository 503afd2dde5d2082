# Round 49 call 3 (no carry; the warm H200): pre-gated H16 T16384 launch by launch, taps off and every tap on for
# a 64-chunk window, with the host's profile (where the taps pair's 1.109-1.111 goes)
. benchmarks/gpu_env.sh
for tw in 0 64; do
  timeout 200 python3 benchmarks/kernel_profile.py --H 16 --T 16384 --settings pregated --taps-window $tw --per-launch \
      --host-profile 25 --json $OUT/profile_pg_taps$tw.json > $OUT/profile_pg_taps$tw.log 2>&1
  echo "exit $? at $SECONDS"
done
