# Round 20, call 2 (eleventh session; code at the commit that adds this file). From the repo root on the
# device machine, no peer:
# 1. the taps-only output pass (vcorr alone now): its V blocks one per program (OUT_NVB=1) and 4 warps,
#    against the default (all V blocks, 8 warps), per launch at H16 T16384, taps on for 64 chunks;
# 2. per-launch profiles of the varlen batch (H32), taps off and on;
# 3. taps on/off at T16384 (H16, H32, varlen) with the default and with OUT_NVB=1;
# 4. in the time left, the GPU tests (test_kernels_gpu.py, the aliased-tap tests).
set -u
R=$OUT/r; mkdir -p "$R"
mkdir -p /tmp/kdadbg_path && ln -sfn "$PWD/kernels" /tmp/kdadbg_path/kdadbg_kernels
P="--H 16 --taps-window 64 --per-launch"
for v in default KDADBG_OUT_NVB=1 KDADBG_OUT_NVB=1,KDADBG_OUT_WARPS=4; do
    tag=$(echo "$v" | tr -c 'A-Za-z0-9\n' '_')
    IFS=, read -ra e <<< "$v"; [ "$v" = default ] && e=()
    env "${e[@]}" PYTHONPATH="$PWD:/tmp/kdadbg_path" python3 benchmarks/kernel_profile.py $P --json "$R/out_$tag.json" \
        > "$R/out_$tag.log" 2>&1; grep -E "kernel time|output|recurrence_kernel" "$R/out_$tag.log" | head -4
done
PROFILE_SHAPES="--H 32 --varlen --per-launch;--H 32 --varlen --taps-window 64 --per-launch" OUT=$R timeout 90 \
    bash benchmarks/gpu_check.sh profile 2>&1 | grep -E "kernel time"
B="--peer none --shapes dense,varlen --heads 16 32 --seqlens 16384 --taps-window 64"
BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/alias timeout 80 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
KDADBG_OUT_NVB=1 BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/nvb1 timeout 80 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
TESTS_SELECT="tests/test_kernels.py::test_aliased_taps_have_the_bits_of_the_stored_taps tests/test_kernels_gpu.py" \
    TESTS_TIMEOUT_S=$((560 - SECONDS)) OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -4
tar czf "$OUT/call2.tgz" -C "$R" .
