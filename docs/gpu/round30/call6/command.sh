# Round 30 call 6 (no carry; COMMIT=<sha> bash docs/gpu/round30/call6/command.sh): the backward finish
# kernel's l2norm backward in one pass over all of K at 8 warps (the old launch: FINISH_BK=64 read twice, 4
# warps) on CUDA (tests/test_kernels.py -k finish, the taps bits, the bf16 case table, the bf16 large cases:
# gpu_tests.log) and kernel by kernel at lower-bound and softplus H32 T16384 and softplus H64 T8192
# (profile_*.*).
W=/tmp/call6
. benchmarks/gpu_env.sh
TESTS_WORKERS=4 TESTS_TIMEOUT_S=200 OUT=$W TESTS_SELECT='tests/test_kernels.py tests/test_kernels_gpu.py
    -k "finish or taps_do_not_change or bf16_case_table or (large_against_reference and bf16)"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "(FAILED|ERROR)" $W/gpu_tests.log | cut -c1-250 | head -20
AB="--ab KDADBG_FINISH_BK=64,KDADBG_FINISH_WARPS=4 --ab KDADBG_FINISH_WARPS=4 --ab KDADBG_FINISH_WARPS=16"
timeout 150 python3 benchmarks/kernel_profile.py --H 32 --settings lower_bound,softplus --iters 3 $AB \
    --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile H32 exit $? at $SECONDS s"
timeout 100 python3 benchmarks/kernel_profile.py --H 64 --T 8192 --settings softplus --iters 3 $AB \
    --json $W/profile_H64.json > $W/profile_H64.log 2>&1
echo "profile H64 exit $? at $SECONDS s"
grep -hE "^ours \[" $W/profile_H32.log $W/profile_H64.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-200
grep -hE "^chunk_bwd_finish" $W/profile_H32.log $W/profile_H64.log | tail -2
cp $W/*.log $W/*.json $W/env.txt $OUT/ 2>/dev/null; ls $OUT
