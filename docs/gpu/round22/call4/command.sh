# Round 22, call 4 (thirteenth session). From the repo root on the device machine, .out/ab_old in carry
# (`git archive 5bb899f kernels`: the kernels before this round, timed through KERNELS_DIR):
# 1. taps on/off at T16384 (H16, H32, varlen H32): this commit's kernels (the K pass's dqd/dkd taps from
#    the P loop's sums where gc is tame, DQKG_TAP_TAME=1, the default), the same with DQKG_TAP_TAME=0
#    (call 3's K pass but for dgT in fp32 mode), and 5bb899f's;
# 2. the per-launch profile at H16 with taps on;
# 3. on CUDA: the taps bits test (both modes; fp32 failed in call 3), the large cases against the float64
#    reference with every tap (fp32 taps at 1e-5), the new tame-path test.
set -u
R=$OUT/r; mkdir -p "$R"
B="--peer none --shapes dense,varlen --heads 16 32 --seqlens 16384 --taps-window 64"
BENCH_ARGS=$B BENCH_BUDGET_S=40 OUT=$R/new timeout 75 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
KDADBG_DQKG_TAP_TAME=0 BENCH_ARGS=$B BENCH_BUDGET_S=40 OUT=$R/notame timeout 75 bash benchmarks/gpu_check.sh bench \
    2>&1 | tail -4
KERNELS_DIR=.out/ab_old/kernels BENCH_ARGS=$B BENCH_BUDGET_S=40 OUT=$R/old timeout 75 \
    bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
PROFILE_SHAPES="--H 16 --taps-window 64 --per-launch" OUT=$R/new timeout 45 bash benchmarks/gpu_check.sh profile \
    2>&1 | grep -E "kernel time|chunk_bwd_dqkg" | head -5
TESTS_SELECT="tests/test_kernels_gpu.py::test_taps_do_not_change_bits_and_runs_repeat
    tests/test_kernels_gpu.py::test_large_against_reference[dense_T16384_H16-fp32]
    tests/test_kernels_gpu.py::test_large_against_reference[varlen_mixed6_H16-fp32]
    tests/test_kernels_gpu.py::test_large_against_reference[strong_T4096_K256_V64-fp32]
    tests/test_kernels_gpu.py::test_large_against_reference[dense_T16384_H16-bf16]
    tests/test_kernels_bwd.py::test_dqd_dkd_taps_from_the_p_loop_sums_where_gc_is_tame" \
    TESTS_TIMEOUT_S=$((560 - SECONDS)) OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -6
tar czf "$OUT/call4.tgz" -C "$R" .
