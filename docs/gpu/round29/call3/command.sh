# Round 29 call 3 (.peer in carry; COMMIT=<sha> bash docs/gpu/round29/call3/command.sh): the new backward
# defaults (the K pass's block loops at 3 / 2 pipeline stages at chunk 64 / 32, the V pass's V tile of 64 in
# bf16 mode at chunk 64). gpu_tests.log: taps on and off the same bits, the bf16 case table, the K pass's
# loop bits test, on CUDA; bench/: ours against fla in three settings at H16 / H32 T16384, H64 T8192 and the
# varlen batch, the old backward launch beside (--ab), the taps-on pairs.
W=/tmp/call3; mkdir -p $W/bench
. benchmarks/gpu_env.sh fla
TESTS_WORKERS=4 TESTS_TIMEOUT_S=150 OUT=$W TESTS_SELECT='tests/test_kernels_gpu.py tests/test_kernels_bwd.py
    -k "taps_do_not_change or bf16_case_table or loop_stages or taps_same_bits"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "\] (PASSED|FAILED)" $W/gpu_tests.log | sed -E 's/.*\] //' | sort | cut -c1-160
cp $W/gpu_tests.log $W/env.txt $OUT/
timeout $((570 - SECONDS)) python3 benchmarks/bench.py --json $W/bench/benchmarks.json --budget-s $((520 - SECONDS)) \
    --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
    --shapes dense_H32_T16384 dense_H16_T16384 dense_H64_T8192 varlen_mixed6_H32 \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 \
    --ab KDADBG_DQKG_LOOP_STAGES=1,KDADBG_DQKGV_BV=32 > $W/bench/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
mkdir -p $OUT/bench; cp $W/bench/* $OUT/bench/
grep -E "^\[bench\]" $W/bench/bench.log | cut -c1-330
