# Round 21, call 4 (twelfth session). From the repo root on the device machine, .out/ab_old in carry
# (`git archive cd91836 kernels`: the kernels of call 3 (b12faf6), timed through KERNELS_DIR):
# 1. taps on/off at T16384 (H16, H32, varlen H32): this commit's kernels (the forward's stored tap
#    buffers NaN-filled by the intra/inverse kernel's launch over the chunks outside the window) and
#    call 3's (those buffers filled by torch.full up front);
# 2. the per-launch profile at H16 with taps on;
# 3. the taps bits test (a window of chunks 100-164 on the varlen batch, both modes) and the new forward
#    fill test, on CUDA.
set -u
R=$OUT/r; mkdir -p "$R"
B="--peer none --shapes dense,varlen --heads 16 32 --seqlens 16384 --taps-window 64"
BENCH_ARGS=$B BENCH_BUDGET_S=40 OUT=$R/new timeout 75 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
KERNELS_DIR=.out/ab_old/kernels BENCH_ARGS=$B BENCH_BUDGET_S=40 OUT=$R/old timeout 75 \
    bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
PROFILE_SHAPES="--H 16 --taps-window 64 --per-launch" OUT=$R/new timeout 45 bash benchmarks/gpu_check.sh profile \
    2>&1 | grep -E "kernel time|intra_solve|Fill" | head -5
TESTS_SELECT="tests/test_kernels_gpu.py::test_taps_do_not_change_bits_and_runs_repeat
    tests/test_kernels_fwd.py::test_forward_tap_buffers_are_nan_filled_by_the_intra_pass" \
    TESTS_TIMEOUT_S=$((330 - SECONDS)) OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -4
tar czf "$OUT/call4.tgz" -C "$R" .
