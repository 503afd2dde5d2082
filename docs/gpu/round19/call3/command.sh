# Round 19, call 3 (run from the repo root on the device machine, .peer in carry): the final code
# (76ed2b9's kernels: call 1's merge; call 2's experiments reverted):
# 1. the benchmark at every shape, ours and fla in one process (fla's autotune results from round 16
#    call 2);
# 2. `kdadbg run` end to end on a T16384 H16 dump, twice, and the float64 reference on the GPU;
# 3. per-launch profiles at H16 T16384, taps off and on for 64 chunks;
# 4. in the time left, the GPU tests of test_kernels_gpu.py.
set -u
R=$OUT/r; mkdir -p "$R"
mkdir -p /tmp/tc && tar xzf docs/gpu/round16/call2/autotune.tgz -C /tmp/tc
TRITON_CACHE_DIR=/tmp/tc TRITON_CACHE_AUTOTUNING=1 BENCH_BUDGET_S=200 OUT=$R \
    BENCH_ARGS="--shapes dense,varlen --heads 16 32 --seqlens 16384 65536 4096 --taps-window 64" \
    timeout 260 bash benchmarks/gpu_check.sh bench 2>&1 | tail -10
OUT=$R timeout 120 bash benchmarks/gpu_check.sh run 2>&1 | grep -E "kdadbg run:|reference|PASS|FAIL" | tail -8
PROFILE_SHAPES="--H 16 --per-launch;--H 16 --taps-window 64 --per-launch" OUT=$R timeout 80 \
    bash benchmarks/gpu_check.sh profile 2>&1 | grep -v -e Warn -e _warn | tail -30
TESTS_SELECT="tests/test_kernels_gpu.py" TESTS_TIMEOUT_S=$((560 - SECONDS)) OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -4
tar czf "$OUT/call3.tgz" -C "$R" .
