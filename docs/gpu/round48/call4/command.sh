# Round 48 call 4 (no carry; the same warm H100 as call 3): why tests/test_diff.py's head 1 x 1.05 had no
# sum_not_checkable on CUDA: `. benchmarks/gpu_env.sh && python3 docs/gpu/round48/call4/diag.py` (diag.log);
# then the test again: `TESTS_WORKERS=1 TESTS_SELECT='tests/test_diff.py -k cannot_be_checked' bash benchmarks/gpu_check.sh tests`
. benchmarks/gpu_env.sh && timeout 200 python3 docs/gpu/round48/call4/diag.py 2>&1 | tee $OUT/diag.log
