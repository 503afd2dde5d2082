# Round 19, call 1 (prepared in the ninth session on branch taps-kpass-fill, NOT yet run). Run from the
# repo root of the branch on the device machine with .ab/main in carry (a copy of main's kernels/:
# `mkdir -p .ab/main && git archive main kernels | tar x -C .ab/main`).
# The backward passes' tap buffers NaN-filled by the K pass's programs over the chunks outside the tap
# window (FILL) instead of a fill kernel up front; A/B against main and against TAPS_FILL_KPASS=0:
# 1. taps on/off (bench.py, no peer) at H16/H32 T16384 and the varlen batch;
# 2. per-kernel profile with taps at H16 T16384 (the K pass's launch over the other chunks, the fills);
# 3. in the time left, the GPU tests of test_kernels_gpu.py.
set -u
R=$OUT/r; mkdir -p "$R"
B="--peer none --shapes dense,varlen --heads 16 32 --seqlens 16384 --taps-window 64"
BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/branch timeout 75 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
KDADBG_TAPS_FILL_KPASS=0 BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/upfront timeout 75 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
KERNELS_DIR=.ab/main/kernels BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/main timeout 75 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
PROFILE_SHAPES="--H 16 --taps-window 64" OUT=$R/branch timeout 60 bash benchmarks/gpu_check.sh profile 2>&1 | grep -v Warn
TESTS_SELECT="tests/test_kernels_gpu.py tests/test_kernels_bwd.py::test_backward_tap_buffers_are_nan_filled_by_the_k_pass" TESTS_TIMEOUT_S=$((560 - SECONDS)) OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -4
tar czf "$OUT/call1.tgz" -C "$R" .
