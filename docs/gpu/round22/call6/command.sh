# Round 22, call 6 (thirteenth session; the code of call 5). From the repo root on the device machine, no
# carry. A second sample of the final code at H16: taps on/off at T16384 and T4096 (call 5: 1.099 and
# 2.01, against 1.64 at T4096 in round 21), and the per-launch profile at T4096 with taps (kernel time
# against wall time: is the taps-on call there bound by the host?).
set -u
R=$OUT/r; mkdir -p "$R"
BENCH_ARGS="--peer none --shapes dense --heads 16 --seqlens 16384 4096 --taps-window 64" BENCH_BUDGET_S=60 \
    OUT=$R timeout 100 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
PROFILE_SHAPES="--H 16 --T 4096 --taps-window 64 --per-launch;--H 16 --T 4096" OUT=$R timeout 80 \
    bash benchmarks/gpu_check.sh profile 2>&1 | grep -E "kernel time" | head -4
tar czf "$OUT/call6.tgz" -C "$R" .
