# Round 30 call 1 (no carry; COMMIT=<sha> bash docs/gpu/round30/call1/command.sh): the forward's launch
# candidates kernel by kernel at lower-bound and softplus H32 T16384 (profile_H32.*): the l2norm's row
# scales in a kernel of their own (PREP_NORM_PASS=1), the w/u kernel in one program per chunk
# (PREP_WU_BOTH=1), the token kernel's K blocks of 64 (PREP_BK=64: two programs per chunk) and one
# program walking the K blocks at 8 and 16 warps (PREP_KSPLIT=0), the intra kernel at 2 warps and K
# blocks of 32; the bits tests of the two new knobs on CUDA (gpu_tests.log).
W=/tmp/call1
. benchmarks/gpu_env.sh
TESTS_WORKERS=2 TESTS_TIMEOUT_S=150 OUT=$W TESTS_SELECT='tests/test_kernels.py -k "k_blocks_in_programs or wu_kernel_one_program"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "(PASSED|FAILED)" $W/gpu_tests.log | sed -E 's/.*(PASSED|FAILED)/\1/' | sort | cut -c1-160
timeout $((570 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --settings lower_bound,softplus --iters 3 \
    --ab KDADBG_PREP_NORM_PASS=1 --ab KDADBG_PREP_WU_BOTH=1 --ab KDADBG_PREP_NORM_PASS=1,KDADBG_PREP_WU_BOTH=1 \
    --ab KDADBG_PREP_BK=64 --ab KDADBG_PREP_KSPLIT=0,KDADBG_PREP_WARPS=8 \
    --ab KDADBG_PREP_KSPLIT=0,KDADBG_PREP_WARPS=16 --ab KDADBG_PREP_SOLVE_WARPS=2 --ab KDADBG_PREP_SOLVE_BK=32 \
    --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours \[|kda_fwd" $W/profile_H32.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-230
cp $W/*.log $W/*.json $W/env.txt $OUT/ 2>/dev/null; ls $OUT
