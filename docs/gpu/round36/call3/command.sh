# Round 36 call 3 (no carry; bash docs/gpu/round36/call3/command.sh), warm after call 2: round 36 call 1's tests
# without its FlashKDA benchmark (the device time left): the launch-only knobs' bits test at its three cases
# (TAPS_STREAMS=1 among them), the taps bits tests (the big one with the tap window on a side stream too) and
# the inference forward's bits tests, on CUDA with round 34's defaults.
export PYTHONUNBUFFERED=1; W=$OUT; . benchmarks/gpu_env.sh; timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_fwd.py tests/test_kernels_gpu.py -k "launch_only_knobs_of_the_prepare or taps_do_not_change or inference_forward_keeps" > $W/gpu_tests.log 2>&1; echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests.log | cut -c1-300
