# Round 18, call 4 (run from the repo root on the device machine, .peer in carry): the final code (the
# K pass's dqd/dkd taps from its P loop; calls 2 and 3's side-stream work removed, as it bought nothing):
# 1. the benchmark at every shape, ours and fla in one process (fla's autotune results from round 16
#    call 2);
# 2. in the time left, the GPU tests of test_kernels_gpu.py.
set -u
R=$OUT/r; mkdir -p "$R"
mkdir -p /tmp/tc && tar xzf docs/gpu/round16/call2/autotune.tgz -C /tmp/tc
TRITON_CACHE_DIR=/tmp/tc TRITON_CACHE_AUTOTUNING=1 BENCH_BUDGET_S=200 OUT=$R \
    BENCH_ARGS="--shapes dense,varlen --heads 16 32 --seqlens 16384 65536 4096 --taps-window 64" \
    timeout 260 bash benchmarks/gpu_check.sh bench 2>&1 | tail -10
TESTS_SELECT="tests/test_kernels_gpu.py" TESTS_TIMEOUT_S=$((490 - SECONDS)) OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -4
tar czf "$OUT/call4.tgz" -C "$R" .
