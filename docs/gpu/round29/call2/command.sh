# Round 29 call 2 (warm after call 1, no carry; COMMIT=<sha> bash docs/gpu/round29/call2/command.sh): the K
# pass's block loops at 3 stages by default at chunk 64 (call 1: lower-bound H32 T16384 K pass 3.837 ->
# 3.440 ms). gpu_tests.log: its bits test on CUDA (chunk 64 and 32 cases) and, with the V pass's V tile of
# 64 (DQKGV_BV=64, a results knob: its products add per tile), the bf16 case table and the large cases
# against the float64 reference; profile_*: the loops at 2 / 4 stages and the V tile of 64 at H32 T16384,
# and chunk 32's loops at 2 / 3 stages (pre-gated H16 T16384, where chunk 32 is a user's choice).
W=/tmp/call2
. benchmarks/gpu_env.sh
TESTS_WORKERS=6 TESTS_TIMEOUT_S=200 OUT=$W TESTS_SELECT='tests/test_kernels_bwd.py -k loop_stages' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300; mv $W/gpu_tests.log $W/gpu_tests_stages.log
KDADBG_DQKGV_BV=64 TESTS_WORKERS=6 TESTS_TIMEOUT_S=240 OUT=$W \
    TESTS_SELECT='tests/test_kernels_gpu.py -k "bf16_case_table or large_against_reference"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check_bv64.log 2>&1
echo "bv64 tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300; mv $W/gpu_tests.log $W/gpu_tests_bv64.log
grep -E "FAILED|Error|error:" $W/gpu_tests_bv64.log | head -8 | cut -c1-300
timeout $((540 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --settings lower_bound,softplus --iters 3 \
    --ab KDADBG_DQKG_LOOP_STAGES=2 --ab KDADBG_DQKG_LOOP_STAGES=4 --ab KDADBG_DQKGV_BV=64 \
    --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours \[" $W/profile_H32.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-250
timeout $((580 - SECONDS)) python3 benchmarks/kernel_profile.py --H 16 --chunk-size 32 --settings softplus --iters 3 \
    --ab KDADBG_DQKG_LOOP_STAGES=2 --ab KDADBG_DQKG_LOOP_STAGES=3 \
    --json $W/profile_H16_c32.json > $W/profile_H16_c32.log 2>&1
echo "profile c32 exit $? at $SECONDS s"
grep -E "^ours \[|^chunk_bwd_dqkg_kernel" $W/profile_H16_c32.log | cut -c1-250
cp $W/*.log $W/*.json $W/env.txt $OUT/ 2>/dev/null; ls $OUT
