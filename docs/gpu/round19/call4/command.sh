# Round 19, call 4 (the device budget's last 247 s): A/B of the token kernel's taps in a loop of their
# own (this commit) against 76ed2b9's kernels (.ab/head, as in call 2): taps on for 64 chunks, every
# tap, all heads, H16/H32 T16384 (bench.py, no peer); then the GPU taps on/off bits tests.
set -u
R=$OUT/r; mkdir -p "$R"
B="--peer none --shapes dense --heads 16 32 --seqlens 16384 --taps-window 64"
KERNELS_DIR=.ab/head/kernels BENCH_ARGS="$B" BENCH_BUDGET_S=25 OUT=$R/head timeout 45 bash benchmarks/gpu_check.sh bench 2>&1 | tail -3
BENCH_ARGS="$B" BENCH_BUDGET_S=25 OUT=$R/new timeout 45 bash benchmarks/gpu_check.sh bench 2>&1 | tail -3
TESTS_SELECT="tests/test_kernels_gpu.py::test_taps_do_not_change_bits_and_runs_repeat" TESTS_TIMEOUT_S=$((150 - SECONDS)) \
    OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -4
tar czf "$OUT/call4.tgz" -C "$R" .
