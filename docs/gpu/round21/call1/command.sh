# Round 21, call 1: PREPARED in the eleventh session, NOT YET RUN. From the repo root on the device
# machine, no peer. The backward state pass with dh0 stored by one more step of its loop into the slot
# just before dSn (KDADBG_RECB_DH0_SLOT=1; sm_90 under Triton 3.6 compiled offline: 255 registers and no
# stack at 32 columns, against 8 B of stack with the store after the loop):
# 1. the varlen batch's per-launch profile, taps off, dh0 stored after the loop / by the loop / not at all;
# 2. taps on/off at T16384 (H16, H32, varlen) with and without the knob;
# 3. the GPU tests with the knob on: the large cases (h0 and dh0 in every one), the taps-bits test, the
#    aliased-tap tests.
set -u
R=$OUT/r; mkdir -p "$R"
for v in KDADBG_RECB_STORE_DH0=1 KDADBG_RECB_STORE_DH0=1,KDADBG_RECB_DH0_SLOT=1 KDADBG_RECB_STORE_DH0=0; do
    tag=$(echo "$v" | tr -c 'A-Za-z0-9\n' '_'); IFS=, read -ra e <<< "$v"
    env "${e[@]}" PROFILE_SHAPES="--H 32 --varlen --per-launch" OUT=$R/$tag timeout 60 \
        bash benchmarks/gpu_check.sh profile 2>&1 | grep -E "kernel time|recurrence_bwd" | head -3
done
B="--peer none --shapes dense,varlen --heads 16 32 --seqlens 16384 --taps-window 64"
BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/main timeout 80 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
KDADBG_RECB_DH0_SLOT=1 BENCH_ARGS=$B BENCH_BUDGET_S=45 OUT=$R/slot timeout 80 bash benchmarks/gpu_check.sh bench 2>&1 | tail -4
KDADBG_RECB_DH0_SLOT=1 TESTS_SELECT="tests/test_kernels_gpu.py tests/test_kernels.py::test_aliased_taps_have_the_bits_of_the_stored_taps
    tests/test_kernels_bwd.py::test_dh0_slot_keeps_the_bits" TESTS_TIMEOUT_S=$((560 - SECONDS)) OUT=$R \
    bash benchmarks/gpu_check.sh tests 2>&1 | tail -4
tar czf "$OUT/call1.tgz" -C "$R" .
