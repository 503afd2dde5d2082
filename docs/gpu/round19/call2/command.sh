# Round 19, call 2. Run from the repo root on the device machine with .ab in carry, .ab/head holding the
# kernels of 76ed2b9 (main after call 1's merge):  mkdir -p .ab/head && git archive 76ed2b9 kernels | tar x -C .ab/head
# A/B of the taps' cost, taps on for 64 chunks, every tap, all heads (bench.py, no peer) at H16/H32
# T16384 and the varlen batch: head; this commit (the forward intra/inverse kernel NaN-fills the
# forward's and dS's buffers over the chunks outside the window and writes the token stage's taps;
# the state pass stores the S and U taps; dS by a masked store); then this commit with each of those
# switched off alone; head again (drift). Then a per-launch profile with taps at H16 T16384, and the
# GPU tests (test_kernels_gpu.py and the fill-group tests).
set -u
R=$OUT/r; mkdir -p "$R"
B="--peer none --shapes dense,varlen --heads 16 32 --seqlens 16384 --taps-window 64"
b() {  # name, then KDADBG_* settings
    local name=$1; shift
    env "$@" BENCH_ARGS="$B" BENCH_BUDGET_S=40 OUT=$R/$name timeout 70 bash benchmarks/gpu_check.sh bench 2>&1 | tail -3
}
b head KERNELS_DIR=.ab/head/kernels
b new
b in_state0 KDADBG_TAPS_IN_STATE=0
b token0 KDADBG_TAPS_TOKEN_IN_SOLVE=0
b fillsolve0 KDADBG_TAPS_FILL_SOLVE=0
b dsmask0 KDADBG_TAPS_DS_MASKED=0
b head2 KERNELS_DIR=.ab/head/kernels
PROFILE_SHAPES="--H 16 --taps-window 64 --per-launch" OUT=$R/new timeout 60 bash benchmarks/gpu_check.sh profile >/dev/null 2>&1
grep -v Warn "$R"/new/profile_*.log | tail -45
TESTS_SELECT="tests/test_kernels_gpu.py tests/test_kernels.py::test_tap_buffers_filled_by_the_kernels tests/test_kernels.py::test_taps_do_not_change_outputs_or_gradients tests/test_kernels_bwd.py::test_backward_tap_buffers_are_nan_filled_by_the_k_pass" \
    TESTS_TIMEOUT_S=$((570 - SECONDS)) OUT=$R bash benchmarks/gpu_check.sh tests 2>&1 | tail -4
tar czf "$OUT/call2.tgz" -C "$R" .
