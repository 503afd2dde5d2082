# Round 18, call 2 (run from the repo root on the device machine). The K pass's dqd/dkd taps with one
# tf32 product (dMqk with its diagonal) per column block, and the tap plan's waiting work on a side
# stream beside the backward K pass over the chunks outside the tap window (TapPlan.run_aside): the NaN
# fill of the backward passes' tap buffers (TAPS_FILL_ASIDE) and the forward's taps-only output pass
# (TAPS_OUT_ASIDE).
# 1. per-kernel profile at H16 T16384 with taps on (64 chunks);
# 2. taps on/off times (bench.py, no peer) at H16/H32 T16384 and the varlen batch: both on (default),
#    both off, the fill only;
# 3. in the time left, the GPU tests of test_kernels_gpu.py.
set -u
R=$OUT/r; mkdir -p "$R"
PROFILE_SHAPES="--H 16 --taps-window 64" OUT=$R/new timeout 60 bash benchmarks/gpu_check.sh profile 2>&1 | grep -v Warn
B="--peer none --shapes dense,varlen --heads 16 32 --seqlens 16384 --taps-window 64"
BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/new timeout 75 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
KDADBG_TAPS_FILL_ASIDE=0 KDADBG_TAPS_OUT_ASIDE=0 BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/noaside timeout 75 \
    bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
KDADBG_TAPS_OUT_ASIDE=0 BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/fillonly timeout 75 \
    bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
TESTS_SELECT="tests/test_kernels_gpu.py" TESTS_TIMEOUT_S=$((560 - SECONDS)) OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -4
tar czf "$OUT/call2.tgz" -C "$R" .
