# Round 26 call 1 (a fresh machine, .peer in carry; COMMIT=<sha> bash docs/gpu/round26/call1/command.sh):
# upstream FlashKDA built in the background for call 2; the GPU suite meanwhile (the inference forward's
# row scales and no-S/U store, the one-launch NaN fills of the aliased taps, on CUDA).
(bash benchmarks/build_flashkda.sh upstream .peer > $OUT/flashkda_build.log 2>&1; tail -1 $OUT/flashkda_build.log > .peer/fk_env.sh) &
{ nvidia-smi; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > $OUT/env.txt 2>&1
TESTS_WORKERS=8 TESTS_TIMEOUT_S=$((540 - SECONDS)) OUT=$OUT bash benchmarks/gpu_check.sh tests > $OUT/gpu_check.log 2>&1
echo "gpu_check exit $?"
tail -4 $OUT/gpu_tests.log | cut -c1-300
grep -E "FAILED|ERROR" $OUT/gpu_tests.log | head -20 | cut -c1-300
tail -3 $OUT/flashkda_build.log | cut -c1-300; cat .peer/fk_env.sh 2>/dev/null | cut -c1-200
