# Round 22, call 5 (thirteenth session; the code of the commit that adds this file: the K pass's tap
# variant with the head slot loaded once, dki's E from gc in registers, dgT from the scan's last row in
# the bf16 modes, and dqd/dkd from the P loop's sums where |gc| <= 20). From the repo root on the device
# machine, .peer (shared/peer) in carry:
# 1. the benchmark at every shape, ours and fla in one process (fla's autotune results from round 16
#    call 2), taps on for 64 chunks;
# 2. `kdadbg run` end to end on a T16384 H16 dump, twice, and the float64 reference on the GPU;
# 3. on CUDA, in the time left: the taps bits test (both modes), the tame-path test, the large dense case
#    against the float64 reference with every tap (fp32) and in bf16 mode.
set -u
R=$OUT/r; mkdir -p "$R"
mkdir -p /tmp/tc && tar xzf docs/gpu/round16/call2/autotune.tgz -C /tmp/tc
TRITON_CACHE_DIR=/tmp/tc TRITON_CACHE_AUTOTUNING=1 BENCH_BUDGET_S=200 OUT=$R \
    BENCH_ARGS="--shapes dense,varlen --heads 16 32 --seqlens 16384 65536 4096 --taps-window 64" \
    timeout 270 bash benchmarks/gpu_check.sh bench 2>&1 | tail -10
OUT=$R timeout 130 bash benchmarks/gpu_check.sh run 2>&1 | grep -E "kdadbg run:|reference|PASS|FAIL" | tail -8
TESTS_SELECT="tests/test_kernels_gpu.py::test_taps_do_not_change_bits_and_runs_repeat
    tests/test_kernels_bwd.py::test_dqd_dkd_taps_from_the_p_loop_sums_where_gc_is_tame
    tests/test_kernels_gpu.py::test_large_against_reference[dense_T16384_H16-fp32]
    tests/test_kernels_gpu.py::test_large_against_reference[dense_T16384_H16-bf16]" \
    TESTS_TIMEOUT_S=$((575 - SECONDS)) OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -6
tar czf "$OUT/call5.tgz" -C "$R" .
