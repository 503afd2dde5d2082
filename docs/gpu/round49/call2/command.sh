# Round 49 call 2 (.peer in carry; the warm H200 of call 1): 87d93e0's test on CUDA, then round 45 call 2's
# command (upstream FlashKDA built, the lower-bound setting at the 10 shapes with fla and FlashKDA in one process)
(TESTS_WORKERS=1 TESTS_SELECT='tests/test_diff.py -k cannot_be_checked' timeout 110 bash benchmarks/gpu_check.sh tests > $OUT/gpu_tests_check.log 2>&1; echo "tests exit $?"; tail -2 $OUT/gpu_tests_check.log | cut -c1-300)
COMMIT=616f785 timeout 470 bash docs/gpu/round45/call2/command.sh
