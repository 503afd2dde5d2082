# Round 34 call 1 (.peer in carry; COMMIT=<sha> bash docs/gpu/round34/call1/command.sh), prepared in round 33 for
# the next session with device time: dba99d1 (bf16 inference forward below chunk 64 through row scales, each
# reader rounding q * rq to fp16) on CUDA: its bits test (gpu_tests.log), then upstream FlashKDA's forward
# against ours at H16 / H32 T16384 and H64 T8192 with the stored fp16 qn, kn beside in the same process
# (--ab KDADBG_INFER_ROWSCALE=0: ours_infer_c16@INFER_ROWSCALE=0 against ours_infer_c16), benchmarks.json.
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh
(timeout 150 bash benchmarks/build_flashkda.sh upstream .peer > $W/flashkda_build.log 2>&1) &
build=$!
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_layouts.py \
    -k "inference_forward_keeps or inference_forward_with_row" > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
wait $build; tail -1 $W/flashkda_build.log > .peer/fk_env.sh
echo "flashkda built at $SECONDS s"; tail -1 $W/flashkda_build.log | cut -c1-200
. .peer/fk_env.sh
timeout $((330 - SECONDS)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((280 - SECONDS)) \
    --commit $COMMIT --peers flashkda --settings lower_bound --shapes dense_H64_T8192 dense_H32_T16384 \
    dense_H16_T16384 --ab KDADBG_INFER_ROWSCALE=0 --taps-at > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-600
