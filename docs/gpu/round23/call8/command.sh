# Call 8 (commit dea5704, .peer in carry): the two tests call 6 failed, then the in-kernel settings with
# PREP_QK_BF16=1 beside the default, in one process (the device time ran out after the first configuration).
mkdir -p /tmp/tc && tar xzf docs/gpu/round16/call2/autotune.tgz -C /tmp/tc
TESTS_SELECT="tests/test_kernels_gpu.py::test_bf16_case_table_on_gpu tests/test_diff.py::test_a_reduced_gradient_carried_in_from_dg_is_drift_and_a_wrong_sum_is_a_bug" \
    TESTS_WORKERS=2 TESTS_TIMEOUT_S=130 OUT=$OUT bash benchmarks/gpu_check.sh tests
TRITON_CACHE_DIR=/tmp/tc TRITON_CACHE_AUTOTUNING=1 BENCH_BUDGET_S=150 \
    BENCH_ARGS="--commit dea5704 --peers fla --settings softplus,lower_bound,pregated --shapes dense_H16_T16384 dense_H32_T16384 --ab KDADBG_PREP_QK_BF16=1 --taps-at lower_bound:dense_H16_T16384" \
    OUT=$OUT timeout $((330 - SECONDS)) bash benchmarks/gpu_check.sh bench
