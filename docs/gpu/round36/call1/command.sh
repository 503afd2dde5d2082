# Round 36 call 1 (round 35 call 1, prepared in round 34; .peer in carry;
# COMMIT=<sha> bash docs/gpu/round36/call1/command.sh). On CUDA with round 34's defaults (the token kernel's
# unrolled loads ahead, the K pass's L2 prefetch): the launch-only knobs' bits test at its three cases, the taps
# bits (with the window's launches on a side stream too, TAPS_STREAMS=1) and the inference forward's bits
# (gpu_tests.log); then upstream FlashKDA's forward against ours at every
# shape of issue 23, lower-bound (FlashKDA's rows at 7 of the 10 shapes are round 27's, commit 64bf3f5).
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh
(timeout 150 bash benchmarks/build_flashkda.sh upstream .peer > $W/flashkda_build.log 2>&1) &
build=$!
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_fwd.py tests/test_kernels_gpu.py \
    -k "launch_only_knobs_of_the_prepare or taps_do_not_change or inference_forward_keeps" > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
wait $build; tail -1 $W/flashkda_build.log > .peer/fk_env.sh
echo "flashkda built at $SECONDS s"; tail -1 $W/flashkda_build.log | cut -c1-200
. .peer/fk_env.sh
timeout $((585 - SECONDS)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((540 - SECONDS)) \
    --commit $COMMIT --peers flashkda --settings lower_bound --taps-at \
    --shapes dense_H64_T8192 dense_H32_T16384 dense_H16_T16384 varlen_mixed6_H32 dense_H16_T8192 dense_H32_T8192 \
    dense_H64_T16384 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-600
