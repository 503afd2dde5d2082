# Round 19, call 1 (prepared in the ninth session, run in the tenth on branch taps-kpass-stack at 02a501a). Run from the repo root of branch
# taps-kpass-stack on the device machine with .ab in carry, holding main's and taps-kpass-fill's kernels:
#   mkdir -p .ab/main .ab/fill && git archive main kernels | tar x -C .ab/main \
#       && git archive taps-kpass-fill kernels | tar x -C .ab/fill
# A/B/C of the taps' cost: main; taps-kpass-fill (the backward passes' tap buffers NaN-filled by the K
# pass's programs over the chunks outside the window); this branch (that, and the K pass's dki/dkr/dgc
# taps stored where formed, their slot index formed again there: 176 -> 96 B of stack, sm_90):
# 1. taps on/off (bench.py, no peer) at H16/H32 T16384 and the varlen batch, for each; and this branch
#    with TAPS_FILL_KPASS=0;
# 2. per-kernel profile with taps at H16 T16384 (this branch);
# 3. in the time left, the GPU tests of test_kernels_gpu.py and the K pass's fill test.
set -u
R=$OUT/r; mkdir -p "$R"
B="--peer none --shapes dense,varlen --heads 16 32 --seqlens 16384 --taps-window 64"
for v in main fill; do
    KERNELS_DIR=.ab/$v/kernels BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/$v timeout 75 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
done
BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/stack timeout 75 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
KDADBG_TAPS_FILL_KPASS=0 BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/stack_upfront timeout 75 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
PROFILE_SHAPES="--H 16 --taps-window 64" OUT=$R/stack timeout 60 bash benchmarks/gpu_check.sh profile 2>&1 | grep -v Warn
TESTS_SELECT="tests/test_kernels_gpu.py tests/test_kernels_bwd.py::test_backward_tap_buffers_are_nan_filled_by_the_k_pass" TESTS_TIMEOUT_S=$((560 - SECONDS)) OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -4
tar czf "$OUT/call1.tgz" -C "$R" .
