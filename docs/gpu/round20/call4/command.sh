# Round 20, call 4 (eleventh session; the code of the commit that adds this file). From the repo root on
# the device machine, no peer. The backward state pass stores dh0 from one more step of its loop (no
# rows) instead of after it:
# 1. the varlen batch's per-launch profile, taps off, with dh0 stored (KDADBG_RECB_STORE_DH0=1) and not;
# 2. taps on/off at T16384 (H16, H32, varlen);
# 3. the GPU tests that check dh0 and the dS tap: the large cases (dense, varlen), the taps-bits test,
#    the aliased-tap tests.
set -u
R=$OUT/r; mkdir -p "$R"
for d in 0 1; do
    KDADBG_RECB_STORE_DH0=$d PROFILE_SHAPES="--H 32 --varlen --per-launch" OUT=$R/dh0_$d timeout 60 \
        bash benchmarks/gpu_check.sh profile 2>&1 | grep -E "kernel time|recurrence_bwd" | head -3
done
BENCH_ARGS="--peer none --shapes dense,varlen --heads 16 32 --seqlens 16384 --taps-window 64" BENCH_BUDGET_S=45 \
    OUT=$R timeout 80 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
G=tests/test_kernels_gpu.py
TESTS_SELECT="$G::test_large_against_reference[varlen_mixed6_H16-bf16] $G::test_large_against_reference[dense_T16384_H16-bf16]
    $G::test_large_against_reference[varlen_mixed6_H16-fp32] $G::test_taps_do_not_change_bits_and_runs_repeat
    tests/test_kernels.py::test_aliased_taps_have_the_bits_of_the_stored_taps" TESTS_TIMEOUT_S=$((290 - SECONDS)) \
    OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -4
tar czf "$OUT/call4.tgz" -C "$R" .
