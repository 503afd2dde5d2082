# Round 30 call 5 (no carry; COMMIT=<sha> bash docs/gpu/round30/call5/command.sh): the token kernel's warps
# and K blocks in the three settings at H32 T16384 (profile_H32.*; kernel_profile's --ab now in every
# setting, pre-gated too), and where a taps-on call's time goes at pre-gated H16 T16384 (every tap on for
# chunks [0, 64) against taps off, kernel by kernel per launch, the host's costliest functions:
# profile_taps_H16.*, profile_notaps_H16.*).
W=/tmp/call5
. benchmarks/gpu_env.sh
timeout 250 python3 benchmarks/kernel_profile.py --H 32 --settings lower_bound,softplus,pregated --iters 3 \
    --ab KDADBG_PREP_WARPS=4 --ab KDADBG_PREP_BK=16,KDADBG_PREP_WARPS=8 --ab KDADBG_PREP_BK=32,KDADBG_PREP_WARPS=8 \
    --ab KDADBG_PREP_BK=64,KDADBG_PREP_WARPS=8 --ab KDADBG_PREP_BK=16,KDADBG_PREP_WARPS=4 \
    --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours \[" $W/profile_H32.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-200
grep -E "^kda_fwd_token" $W/profile_H32.log | tail -1
for t in 0 64; do
    n=$([ $t = 0 ] && echo notaps || echo taps)
    timeout 120 python3 benchmarks/kernel_profile.py --H 16 --T 16384 --settings pregated --iters 5 --taps-window $t \
        --per-launch --host-profile 25 --json $W/profile_${n}_H16.json > $W/profile_${n}_H16.log 2>&1
    echo "profile $n exit $? at $SECONDS s"; grep -E "^ours \[" $W/profile_${n}_H16.log | cut -c1-250
done
cp $W/*.log $W/*.json $W/env.txt $OUT/ 2>/dev/null; ls $OUT
