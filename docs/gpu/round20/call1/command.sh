# Round 20, call 1 (eleventh session). Run from the repo root on the device machine (no peer: taps only).
# The aliased taps (kernels/common.py ALIAS_TAPS: 12 taps read from the kernels' own tensors instead of
# stored a second time), A/B against the kernels storing them (KDADBG_TAPS_ALIAS=0, the code before):
# 1. taps on for 64 chunks, every tap, all heads: aliased at H16/H32 x T16384/4096/65536 and the varlen
#    batch; stored at T16384 and varlen; aliased again at T16384 (the spread between runs);
# 2. per-launch profile with taps at H16 T16384 (aliased);
# 3. in the time left, the GPU tests: test_kernels_gpu.py and the aliased-tap tests of test_kernels.py.
set -u
R=$OUT/r; mkdir -p "$R"
B="--peer none --shapes dense,varlen --heads 16 32 --taps-window 64"
BENCH_ARGS="$B --seqlens 16384 4096 65536" BENCH_BUDGET_S=110 OUT=$R/alias timeout 150 bash benchmarks/gpu_check.sh bench 2>&1 | tail -9
KDADBG_TAPS_ALIAS=0 BENCH_ARGS="$B --seqlens 16384" BENCH_BUDGET_S=45 OUT=$R/stored timeout 80 bash benchmarks/gpu_check.sh bench 2>&1 | tail -5
BENCH_ARGS="$B --seqlens 16384" BENCH_BUDGET_S=45 OUT=$R/alias2 timeout 80 bash benchmarks/gpu_check.sh bench 2>&1 | tail -5
PROFILE_SHAPES="--H 16 --per-launch;--H 16 --taps-window 64 --per-launch" OUT=$R/alias timeout 60 bash benchmarks/gpu_check.sh profile 2>&1 | grep -v -e Warn -e _warn | tail -30
TESTS_SELECT="tests/test_kernels.py::test_aliased_taps_have_the_bits_of_the_stored_taps tests/test_kernels_gpu.py" TESTS_TIMEOUT_S=$((560 - SECONDS)) OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -6
tar czf "$OUT/call1.tgz" -C "$R" .
