# Round 32 call 2 (.peer in carry; COMMIT=<sha> bash docs/gpu/round32/call2/command.sh): fp16 qn, kn the bf16 default
# (PREP_QK_LOWP=2; call 1's finish in the K pass dropped). On CUDA (gpu_tests.log): the fp16 storage test, the
# inference forward's bits, the taps bits, the bf16 case table and the bf16 large cases against the float64
# reference. The benchmark against fla, the three settings at H32 / H16 T16384, H64 T8192 and the varlen batch,
# ours with fp32 qn, kn beside (PREP_QK_LOWP=0) in the in-kernel settings, and the taps-on pairs (benchmarks.json).
W=$OUT
. benchmarks/gpu_env.sh fla
TESTS_WORKERS=4 TESTS_TIMEOUT_S=190 OUT=$W TESTS_SELECT='tests/test_kernels.py tests/test_kernels_fwd.py
    tests/test_kernels_gpu.py -k "normalised_qk or inference_forward_keeps or taps_do_not_change or bf16_case_table
    or (large_against_reference and bf16)"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "(FAILED|ERROR)" $W/gpu_tests.log | cut -c1-250 | head -20
timeout $((590 - SECONDS)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((570 - SECONDS)) \
    --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated --ab KDADBG_PREP_QK_LOWP=0 \
    --ab-settings lower_bound,softplus \
    --shapes dense_H32_T16384 dense_H16_T16384 dense_H64_T8192 varlen_mixed6_H32 \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"; ls -la $W/benchmarks.json
grep -E "^\[bench\]" $W/bench.log | cut -c1-400
