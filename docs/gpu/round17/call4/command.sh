# Round 17, call 4 (run from the repo root on the device machine, .peer in carry): the forward's large
# GPU tests (cut by the time cap in calls 2 and 3) with their durations; the benchmark at every shape,
# ours and fla in one process (fla's autotune results from round 16 call 2); kdadbg run end to end and
# the float64 reference's time at H16 T16384.
set -u
TESTS_TIMEOUT_S=80 TESTS_SELECT="tests/test_kernels_fwd.py -k gpu_large" bash benchmarks/gpu_check.sh tests 2>&1 | tail -8
mkdir -p /tmp/tc && tar xzf docs/gpu/round16/call2/autotune.tgz -C /tmp/tc
TRITON_CACHE_DIR=/tmp/tc TRITON_CACHE_AUTOTUNING=1 BENCH_BUDGET_S=240 \
    BENCH_ARGS="--shapes dense,varlen --heads 16 32 --seqlens 16384 65536 4096 --taps-window 64" \
    timeout 300 bash benchmarks/gpu_check.sh bench 2>&1 | tail -12
timeout 110 bash benchmarks/gpu_check.sh run 2>&1 | tail -8
