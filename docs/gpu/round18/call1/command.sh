# Round 18, call 1 (run from the repo root on the device machine, .ab/r17 in carry: the kernels of
# a1fe7ab). The K pass's dqd/dkd taps from the P loop's own products, and the later stages' tap
# buffers NaN-filled on a side stream beside the forward state pass (TAPS_FILL_ASIDE):
# (last, in the time left) the GPU tests of test_kernels_gpu.py (taps against the float64 reference, taps on/off bits, the
#    side-stream fill against the fill up front);
# 1. per-kernel profiles at H16 T16384: this code with taps on (64 chunks) and off, a1fe7ab's with taps;
# 2. taps on/off times (bench.py, no peer) at H16/H32 T16384: this code, with TAPS_FILL_ASIDE=0, a1fe7ab's.
set -u
R=$OUT/r; mkdir -p "$R"
PROFILE_SHAPES="--H 16 --taps-window 64;--H 16" OUT=$R/new timeout 90 bash benchmarks/gpu_check.sh profile 2>&1 | grep -v Warn
KERNELS_DIR=.ab/r17/kernels PROFILE_SHAPES="--H 16 --taps-window 64" OUT=$R/old timeout 50 \
    bash benchmarks/gpu_check.sh profile 2>&1 | grep -v Warn
B="--peer none --shapes dense --heads 16 32 --seqlens 16384 --taps-window 64"
BENCH_ARGS=$B BENCH_BUDGET_S=30 OUT=$R/new timeout 60 bash benchmarks/gpu_check.sh bench 2>&1 | tail -3
KDADBG_TAPS_FILL_ASIDE=0 BENCH_ARGS=$B BENCH_BUDGET_S=30 OUT=$R/noaside timeout 60 bash benchmarks/gpu_check.sh bench 2>&1 | tail -3
KERNELS_DIR=.ab/r17/kernels BENCH_ARGS=$B BENCH_BUDGET_S=30 OUT=$R/old timeout 60 bash benchmarks/gpu_check.sh bench 2>&1 | tail -3
TESTS_SELECT="tests/test_kernels_gpu.py" TESTS_TIMEOUT_S=$((560 - SECONDS)) OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -4
tar czf "$OUT/call1.tgz" -C "$R" .
