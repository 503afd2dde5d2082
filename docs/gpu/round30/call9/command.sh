# Round 30 call 9 (no carry; COMMIT=<sha> bash docs/gpu/round30/call9/command.sh): launch-only knobs never
# A/B'd before, their bits test on CUDA (gpu_tests.log), then kernel by kernel at lower-bound H32 T16384
# (profile_H32.*): the token and intra kernels' pipeline stages, the backward precompute's warps and K / V
# blocks, the finish kernel at 16 warps. Written to $OUT as it runs.
W=$OUT
. benchmarks/gpu_env.sh
TESTS_WORKERS=3 TESTS_TIMEOUT_S=60 OUT=$W TESTS_SELECT='tests/test_kernels.py -k launch_only_knobs_of_the_prepare' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "(PASSED|FAILED)" $W/gpu_tests.log | sed -E 's/.*(PASSED|FAILED)/\1/' | cut -c1-160
timeout $((165 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --settings lower_bound --iters 3 \
    --ab KDADBG_PREP_STAGES=1 --ab KDADBG_PREP_STAGES=2 --ab KDADBG_PREP_SOLVE_STAGES=1 \
    --ab KDADBG_PREP_SOLVE_STAGES=2 --ab KDADBG_BPREP_WARPS=4 --ab KDADBG_BPREP_BK=32,KDADBG_BPREP_BV=32 \
    --ab KDADBG_FINISH_WARPS=16 --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours \[" $W/profile_H32.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-200
grep -E "^(kda_fwd_token|kda_fwd_intra|chunk_bwd_prep|chunk_bwd_finish)" $W/profile_H32.log | tail -4
