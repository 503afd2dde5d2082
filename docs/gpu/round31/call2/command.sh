# Round 31 call 2 (.peer in carry; COMMIT=<sha> bash docs/gpu/round31/call2/command.sh): the tap window's NaN fills
# of INV, Mqk, S, U and of dMqk, dL, dkr moved into the intra kernel's and the V pass's launches outside the
# window (common.kernel_fills). On CUDA (gpu_tests.log): the taps bits, the fill tests, the launch-only knobs'
# bits test, the bf16 case table. Kernel by kernel, pre-gated H16 T16384 with taps on for chunks [0, 64) and
# off, with the host's profile (profile_*_H16.*). Then the benchmark against fla with round 30 call 9's
# defaults, the three settings at H32 / H16 T16384, H64 T8192 and the varlen batch, and the taps-on pairs
# (bench/). Written to $OUT as it runs.
W=$OUT; mkdir -p $W/bench
. benchmarks/gpu_env.sh fla
TESTS_WORKERS=4 TESTS_TIMEOUT_S=150 OUT=$W TESTS_SELECT='tests/test_kernels.py tests/test_kernels_gpu.py
    tests/test_kernels_fwd.py tests/test_kernels_bwd.py -k "launch_only_knobs_of_the_prepare or taps_do_not_change
    or nan_fill or kernel_fills or bf16_case_table"' bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "(FAILED|ERROR)" $W/gpu_tests.log | cut -c1-250 | head -20
for tw in 0 64; do
    n=$([ $tw = 0 ] && echo notaps || echo taps)
    timeout 60 python3 benchmarks/kernel_profile.py --H 16 --T 16384 --settings pregated --iters 5 \
        --taps-window $tw --per-launch --host-profile 40 --json $W/profile_${n}_H16.json > $W/profile_${n}_H16.log 2>&1
    echo "profile $n exit $? at $SECONDS s"; grep -E "^ours \[" $W/profile_${n}_H16.log | cut -c1-330
done
timeout $((590 - SECONDS)) python3 benchmarks/bench.py --json $W/bench/benchmarks.json --budget-s $((560 - SECONDS)) \
    --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
    --shapes dense_H32_T16384 dense_H16_T16384 dense_H64_T8192 varlen_mixed6_H32 \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 > $W/bench/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench/bench.log | cut -c1-300
