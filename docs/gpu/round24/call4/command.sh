# Round 24 call 4 (.peer in carry; the kernels with Mqk in bf16, knob MQK_BF16): on CUDA, the same-bits
# tests of Mqk in bf16 and of the aliased taps, taps on/off bits, the large bf16 cases against the
# reference; then (a) ours with MQK_BF16 on (the new default) against off, and on with REC_U_AHEAD=1, beside
# fla, in the three settings at H16 and H32 T16384, with the taps ratios; (b) ours and fla at the shapes
# call 3 left (T8192, T65536, the lower-bound varlen batch), as far as the time goes.
TESTS_SELECT='tests/test_kernels.py tests/test_kernels_gpu.py -k "mqk_in_bf16 or aliased_taps or taps_do_not_change or (large_against_reference and bf16)"' \
    TESTS_WORKERS=8 TESTS_TIMEOUT_S=170 OUT=$OUT bash benchmarks/gpu_check.sh tests > /dev/null 2>&1
tail -4 $OUT/gpu_tests.log
mkdir -p $OUT/a $OUT/b
BENCH_BUDGET_S=150 BENCH_ARGS="--commit $COMMIT --peers fla --shapes dense_H16_T16384 dense_H32_T16384 \
    --ab KDADBG_MQK_BF16=0 --ab KDADBG_REC_U_AHEAD=1 --ab-settings pregated,softplus,lower_bound" \
    OUT=$OUT/a timeout 260 bash benchmarks/gpu_check.sh bench > /dev/null 2>&1
grep -E "^\[bench\]" $OUT/a/bench.log | cut -c1-400
rm -f $OUT/a/env.txt $OUT/a/autotune.tgz
BENCH_BUDGET_S=$((480 - SECONDS)) BENCH_ARGS="--commit $COMMIT --peers fla --taps-at \
    --shapes varlen_mixed6_H32 dense_H16_T8192 dense_H32_T8192 dense_H16_T65536 dense_H32_T65536" \
    OUT=$OUT/b timeout $((575 - SECONDS)) bash benchmarks/gpu_check.sh bench > /dev/null 2>&1
grep -E "^\[bench\]" $OUT/b/bench.log | cut -c1-300
rm -f $OUT/b/env.txt
