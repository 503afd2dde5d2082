# Round 25 call 3 (warm; fla installed in .peer/site by call 1): the whole GPU suite at the current defaults.
TESTS_WORKERS=8 TESTS_TIMEOUT_S=480 OUT=$OUT bash benchmarks/gpu_check.sh tests > /dev/null 2>&1
tail -5 $OUT/gpu_tests.log
