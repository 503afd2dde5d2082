# Round 30 call 3 (no carry; COMMIT=<sha> bash docs/gpu/round30/call3/command.sh): the new forward launch
# (the token kernel at chunk 64 with the gate in the kernel as one program of 8 warps over K blocks of 16,
# the w/u kernel's two products in one program) on CUDA: tests/test_kernels.py whole, the taps bits test,
# the bf16 case table and the bf16 large cases against the float64 reference (gpu_tests.log); kernel by
# kernel at H32 T16384 in the three settings, with the pre-gated token kernel's blocks and warps beside
# (profile_H32.*).
W=/tmp/call3
. benchmarks/gpu_env.sh
TESTS_WORKERS=4 TESTS_TIMEOUT_S=330 OUT=$W TESTS_SELECT='tests/test_kernels.py tests/test_kernels_gpu.py
    -k "not test_kernels_gpu or taps_do_not_change or bf16_case_table or (large_against_reference and bf16)"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "(FAILED|ERROR)" $W/gpu_tests.log | cut -c1-250 | head -20
timeout $((570 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --settings lower_bound,softplus,pregated --iters 3 \
    --ab KDADBG_PREP_BK=16,KDADBG_PREP_WARPS=8 --ab KDADBG_PREP_BK=32,KDADBG_PREP_WARPS=8 \
    --ab KDADBG_PREP_BK=64,KDADBG_PREP_WARPS=8 \
    --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours \[" $W/profile_H32.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-200
grep -E "^kda_fwd_(token|wu)" $W/profile_H32.log | tail -4
cp $W/*.log $W/*.json $W/env.txt $OUT/ 2>/dev/null; ls $OUT
