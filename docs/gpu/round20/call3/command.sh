# Round 20, call 3 (eleventh session; the code of the commit that adds this file). From the repo root on
# the device machine, .peer (shared/peer) in carry:
# 1. the benchmark at every shape, ours and fla in one process (fla's autotune results from round 16
#    call 2), taps on for 64 chunks with the aliased taps;
# 2. `kdadbg run` end to end on a T16384 H16 dump, twice, and the float64 reference on the GPU;
# 3. the varlen batch's per-launch profile, taps off, with the backward state pass storing dh0
#    (KDADBG_RECB_STORE_DH0=1, as the aliased dS tap has it) and without: what that store costs there.
set -u
R=$OUT/r; mkdir -p "$R"
mkdir -p /tmp/tc && tar xzf docs/gpu/round16/call2/autotune.tgz -C /tmp/tc
TRITON_CACHE_DIR=/tmp/tc TRITON_CACHE_AUTOTUNING=1 BENCH_BUDGET_S=200 OUT=$R \
    BENCH_ARGS="--shapes dense,varlen --heads 16 32 --seqlens 16384 65536 4096 --taps-window 64" \
    timeout 270 bash benchmarks/gpu_check.sh bench 2>&1 | tail -10
OUT=$R timeout 130 bash benchmarks/gpu_check.sh run 2>&1 | grep -E "kdadbg run:|reference|PASS|FAIL" | tail -8
for d in 0 1; do
    KDADBG_RECB_STORE_DH0=$d PROFILE_SHAPES="--H 32 --varlen --per-launch" OUT=$R/dh0_$d timeout 60 \
        bash benchmarks/gpu_check.sh profile 2>&1 | grep -E "kernel time|recurrence_bwd" | head -3
done
tar czf "$OUT/call3.tgz" -C "$R" .
