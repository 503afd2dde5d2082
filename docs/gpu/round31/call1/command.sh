# Round 31 call 1 (no carry; COMMIT=<sha> bash docs/gpu/round31/call1/command.sh): the launch-only knobs' bits
# test with round 30 call 9's defaults (the intra kernel at 2 stages, the backward precompute at 4 warps) and
# the new stage knobs, the taps bits, the bf16 case table and the bf16 large cases on CUDA (gpu_tests.log);
# then kernel by kernel at lower-bound H32 T16384 (profile_H32.*): pipeline stages never A/B'd before (w/u,
# backward precompute, finish, V pass, K pass loops, state passes) and the precompute's K / V blocks of 32 at 4
# warps; and pre-gated H16 T16384 with taps on for chunks [0, 64) and off, with the host's profile
# (profile_taps_H16.*, profile_notaps_H16.*). Written to $OUT as it runs.
W=$OUT
. benchmarks/gpu_env.sh
TESTS_WORKERS=4 TESTS_TIMEOUT_S=200 OUT=$W TESTS_SELECT='tests/test_kernels.py tests/test_kernels_gpu.py
    -k "launch_only_knobs_of_the_prepare or taps_do_not_change or bf16_case_table or (large_against_reference and bf16)"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "(FAILED|ERROR)" $W/gpu_tests.log | cut -c1-250 | head -20
timeout $((470 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --settings lower_bound --iters 3 \
    --ab KDADBG_PREP_WU_STAGES=1 --ab KDADBG_PREP_WU_STAGES=2 --ab KDADBG_PREP_WU_STAGES=4 \
    --ab KDADBG_BPREP_STAGES=1 --ab KDADBG_BPREP_STAGES=2 --ab KDADBG_BPREP_BK=32,KDADBG_BPREP_BV=32 \
    --ab KDADBG_FINISH_STAGES=1 --ab KDADBG_DQKGV_STAGES=2 --ab KDADBG_DQKGV_STAGES=4 \
    --ab KDADBG_DQKG_LOOP_STAGES=2 --ab KDADBG_DQKG_LOOP_STAGES=4 --ab KDADBG_RECB_STAGES=2 \
    --ab KDADBG_REC_STAGES=2 --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours \[" $W/profile_H32.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-200
for tw in 0 64; do
    n=$([ $tw = 0 ] && echo notaps || echo taps)
    timeout $((585 - SECONDS)) python3 benchmarks/kernel_profile.py --H 16 --T 16384 --settings pregated --iters 5 \
        --taps-window $tw --per-launch --host-profile 40 --json $W/profile_${n}_H16.json > $W/profile_${n}_H16.log 2>&1
    echo "profile $n exit $? at $SECONDS s"; grep -E "^ours \[" $W/profile_${n}_H16.log | cut -c1-330
done
