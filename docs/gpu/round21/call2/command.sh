# Round 21, call 2 (twelfth session). From the repo root on the device machine, .out/ab_old in carry
# (`git archive 93a8819 kernels`: the kernels before this round, timed through KERNELS_DIR):
# 1. taps on/off at T16384 (H16, H32, varlen H32): this commit's kernels (the K pass's dqd/dkd taps from
#    its P loop where gc is tame; dh0 by the loop's extra step), the same with every K pass program
#    forming those taps from products of their own (KDADBG_DQKG_TAP_SPREAD=-1), and 93a8819's kernels;
# 2. the per-launch profile at H16 with taps on;
# 3. the GPU tests (large dense and varlen cases against the float64 reference with every tap, taps bits)
#    and the new K pass tap test on CUDA.
set -u
R=$OUT/r; mkdir -p "$R"
B="--peer none --shapes dense,varlen --heads 16 32 --seqlens 16384 --taps-window 64"
BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/new timeout 80 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
KDADBG_DQKG_TAP_SPREAD=-1 BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/fallback timeout 80 \
    bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
KERNELS_DIR=.out/ab_old/kernels BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/old timeout 80 \
    bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
PROFILE_SHAPES="--H 16 --taps-window 64 --per-launch" OUT=$R/new timeout 60 bash benchmarks/gpu_check.sh profile \
    2>&1 | grep -E "kernel time|chunk_bwd_dqkg|Fill" | head -5
TESTS_SELECT="tests/test_kernels_gpu.py tests/test_kernels_bwd.py::test_dqd_dkd_taps_from_the_p_loop_or_products_of_their_own" \
    TESTS_TIMEOUT_S=$((575 - SECONDS)) OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -4
tar czf "$OUT/call2.tgz" -C "$R" .
