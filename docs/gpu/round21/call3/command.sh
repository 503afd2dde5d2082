# Round 21, call 3 (twelfth session; the code of the commit that adds this file: 93a8819's kernels with
# dh0 stored by the backward state pass's extra loop step at 32 columns or more). From the repo root on
# the device machine, .peer (shared/peer) in carry:
# 1. the benchmark at every shape, ours and fla in one process (fla's autotune results from round 16
#    call 2), taps on for 64 chunks;
# 2. `kdadbg run` end to end on a T16384 H16 dump, twice, and the float64 reference on the GPU.
set -u
R=$OUT/r; mkdir -p "$R"
mkdir -p /tmp/tc && tar xzf docs/gpu/round16/call2/autotune.tgz -C /tmp/tc
TRITON_CACHE_DIR=/tmp/tc TRITON_CACHE_AUTOTUNING=1 BENCH_BUDGET_S=200 OUT=$R \
    BENCH_ARGS="--shapes dense,varlen --heads 16 32 --seqlens 16384 65536 4096 --taps-window 64" \
    timeout 270 bash benchmarks/gpu_check.sh bench 2>&1 | tail -10
OUT=$R timeout 130 bash benchmarks/gpu_check.sh run 2>&1 | grep -E "kdadbg run:|reference|PASS|FAIL" | tail -8
tar czf "$OUT/call3.tgz" -C "$R" .
