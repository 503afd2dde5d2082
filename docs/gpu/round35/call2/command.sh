# Round 35 call 2 (no carry; bash docs/gpu/round35/call2/command.sh): with the K pass's
# L2 prefetch now the default, its launch knobs again (8 warps, 2 loop stages), kernel by kernel at lower-bound
# H32 T16384; then the token kernel's loads ahead at the 4-warp launches of chunk 32 (K blocks of 32, gate in
# the kernel), softplus H32 T16384.
export PYTHONUNBUFFERED=1
. benchmarks/gpu_env.sh
timeout 200 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound \
    --ab KDADBG_DQKG_WARPS=8 --ab KDADBG_DQKG_LOOP_STAGES=2 --ab KDADBG_DQKG_PREFETCH=0 \
    --json $OUT/profile_H32.json > $OUT/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -A6 "^forward+backward, kernel time" $OUT/profile_H32.log | cut -c1-200
timeout 150 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --chunk-size 32 --settings softplus \
    --ab KDADBG_PREP_AHEAD=1 --ab KDADBG_PREP_AHEAD=1,KDADBG_PREP_UNROLL=4 \
    --json $OUT/profile_H32_c32.json > $OUT/profile_H32_c32.log 2>&1
echo "profile c32 exit $? at $SECONDS s"
grep -A6 "^forward, kernel time" $OUT/profile_H32_c32.log | cut -c1-200
# Then where the taps' extra time goes today: per launch, taps on for chunks [0, 64) and off, lower-bound H32
# T16384 and pre-gated H16 T16384 (the two taps pairs of issue 23), with the host's profile.
for cfg in "32 lower_bound" "16 pregated"; do
    set -- $cfg
    for tw in 0 64; do
        n=$([ $tw = 0 ] && echo notaps || echo taps)_$2_H$1
        timeout $((585 - SECONDS)) python3 benchmarks/kernel_profile.py --H $1 --T 16384 --settings $2 --iters 5 \
            --taps-window $tw --per-launch --host-profile 30 --json $OUT/profile_$n.json > $OUT/profile_$n.log 2>&1
        echo "profile $n exit $? at $SECONDS s"; grep -E "^ours \[" $OUT/profile_$n.log | cut -c1-330
    done
done
