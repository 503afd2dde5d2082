# Round 32 call 1 (.peer in carry; COMMIT=<sha> bash docs/gpu/round32/call1/command.sh): the finish in the K pass
# (DQKG_FINISH=1, the new bf16 default: the last of a chunk's K block programs does the l2norm backward, db and
# dbeta) and fp16 qn, kn (PREP_QK_BF16=2, off). On CUDA (gpu_tests.log): the finish's bits test against the
# finish kernel, the fp16 storage test, the taps bits, the bf16 case table and the bf16 large cases against
# the float64 reference; then the bf16 case table with fp16 qn, kn (gpu_tests_qk16.log). Kernel by kernel at
# lower-bound H32 T16384 (profile_H32.*). The benchmark against fla, the three settings at H32 / H16 T16384,
# H64 T8192 and the varlen batch, ours with the finish kernel and with fp16 qn, kn beside (benchmarks.json).
W=$OUT
. benchmarks/gpu_env.sh fla
TESTS_WORKERS=4 TESTS_TIMEOUT_S=170 OUT=$W TESTS_SELECT='tests/test_kernels_bwd.py tests/test_kernels_fwd.py
    tests/test_kernels_gpu.py -k "finish_in_the_k_pass or normalised_qk or taps_do_not_change or bf16_case_table
    or (large_against_reference and bf16)"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "(FAILED|ERROR)" $W/gpu_tests.log | cut -c1-250 | head -20
KDADBG_PREP_QK_BF16=2 timeout 90 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_kernels_gpu.py \
    -k bf16_case_table > $W/gpu_tests_qk16.log 2>&1
echo "qk16 tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests_qk16.log | cut -c1-300
grep -E "(FAILED|ERROR)" $W/gpu_tests_qk16.log | cut -c1-250 | head -20
timeout 100 python3 benchmarks/kernel_profile.py --H 32 --settings lower_bound --iters 3 \
    --ab KDADBG_DQKG_FINISH=0 --ab KDADBG_PREP_QK_BF16=2 --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours \[" $W/profile_H32.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-200
timeout $((585 - SECONDS)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((560 - SECONDS)) \
    --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated --ab KDADBG_DQKG_FINISH=0 \
    --ab KDADBG_PREP_QK_BF16=2 --ab-settings lower_bound,softplus \
    --shapes dense_H32_T16384 dense_H16_T16384 dense_H64_T8192 varlen_mixed6_H32 \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"; ls -la $W/benchmarks.json
grep -E "^\[bench\]" $W/bench.log | cut -c1-400
