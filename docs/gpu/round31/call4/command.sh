# Round 31 call 4 (.peer in carry; COMMIT=<sha> bash docs/gpu/round31/call4/command.sh): the backward state pass
# at 2 pipeline stages (RECB_STAGES, the new default; 3 before). On CUDA (gpu_tests.log): the launch-only
# knobs' bits test (RECB_STAGES 3 and 1 against the default among them) and the taps bits. The benchmark
# against fla at every shape of call 3, with ours at the old 3 stages beside (ours@RECB_STAGES=3, lower-bound
# and pre-gated), and the taps-on pairs (benchmarks.json, bench.log).
W=$OUT
. benchmarks/gpu_env.sh fla
TESTS_WORKERS=4 TESTS_TIMEOUT_S=80 OUT=$W TESTS_SELECT='tests/test_kernels.py tests/test_kernels_gpu.py
    -k "launch_only_knobs_of_the_prepare or taps_do_not_change_bits"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "(FAILED|ERROR)" $W/gpu_tests.log | cut -c1-250 | head -20
timeout $((300 - SECONDS)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((270 - SECONDS)) \
    --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated --ab KDADBG_RECB_STAGES=3 \
    --ab-settings lower_bound,pregated \
    --shapes dense_H32_T16384 dense_H16_T16384 dense_H64_T8192 varlen_mixed6_H32 \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"; ls -la $W/benchmarks.json
grep -E "^\[bench\]" $W/bench.log | cut -c1-400
