# Round 28 call 4 (a fresh machine, no carry; bash docs/gpu/round28/call4/command.sh): the new defaults on
# CUDA: the backward reading the forward's qd and w (BWD_FWD_OPERANDS=3), the inference forward storing
# qn, kn at chunk 64 with the training forward's token launch. The bits tests of both, the bf16 case table
# and the large bf16 cases against the float64 reference, taps on and off (gpu_tests.log).
export PYTHONUNBUFFERED=1
TESTS_WORKERS=8 TESTS_TIMEOUT_S=330 OUT=$OUT \
    TESTS_SELECT='tests/test_kernels.py tests/test_kernels_gpu.py tests/test_kernels_fwd.py -k "forward_operands or forward_w or inference_forward or bf16_mode or taps_do_not_change or bf16_case_table or (large_against_reference and bf16) or op_gpu_bf16_large or row_scales"' \
    bash benchmarks/gpu_check.sh tests > /tmp/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $OUT/gpu_tests.log | cut -c1-300
grep -oE "(PASSED|FAILED|ERROR) tests\S+" $OUT/gpu_tests.log | sort | uniq | cut -c1-160
