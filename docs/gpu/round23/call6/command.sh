# Call 6 (commit ca0e328, .peer in carry): the GPU suite, FlashKDA's fork built beside it for call 7.
(bash benchmarks/build_flashkda.sh fork .peer > $OUT/flashkda_build.log 2>&1; tail -1 $OUT/flashkda_build.log > .peer/fk_env.sh) &
TESTS_WORKERS=8 TESTS_TIMEOUT_S=450 OUT=$OUT bash benchmarks/gpu_check.sh tests; wait
