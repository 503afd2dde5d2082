# Round 31 call 3 (.peer in carry; COMMIT=<sha> bash docs/gpu/round31/call3/command.sh): after the revert of call
# 2's in-kernel fills, with round 30 call 9's defaults. On CUDA (gpu_tests.log): the taps bits, the bf16 case
# table and the bf16 large cases against the float64 reference. The benchmark against fla, the three settings
# at H32 / H16 T16384, H64 T8192 and the varlen batch, and the taps-on pairs (benchmarks.json, bench.log). Then
# kernel by kernel at lower-bound H32 T16384 the launch variants call 1 did not reach (profile_H32.*).
W=$OUT
. benchmarks/gpu_env.sh fla
TESTS_WORKERS=4 TESTS_TIMEOUT_S=220 OUT=$W TESTS_SELECT='tests/test_kernels.py tests/test_kernels_gpu.py
    -k "taps_do_not_change or bf16_case_table or (large_against_reference and bf16)"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "(FAILED|ERROR)" $W/gpu_tests.log | cut -c1-250 | head -20
timeout $((540 - SECONDS)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((520 - SECONDS)) \
    --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
    --shapes dense_H32_T16384 dense_H16_T16384 dense_H64_T8192 varlen_mixed6_H32 \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"; ls -la $W/benchmarks.json
grep -E "^\[bench\]" $W/bench.log | cut -c1-300
timeout $((590 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --settings lower_bound --iters 3 \
    --ab KDADBG_DQKG_LOOP_STAGES=2 --ab KDADBG_DQKG_LOOP_STAGES=4 --ab KDADBG_RECB_STAGES=2 --ab KDADBG_REC_STAGES=2 \
    --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours \[" $W/profile_H32.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-200
