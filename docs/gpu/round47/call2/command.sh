# Round 47 call 2 (no carry; COMMIT=<sha> bash docs/gpu/round47/call2/command.sh): short, with little device time
# left after the round's failed starts: the CUDA tests of the K pass's dqd/dkd taps (now from the P loop's sums)
# and of the taps' bits, then bench.py's taps pairs (ours alone) at lower-bound H32 T16384 as time allows.
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_bwd.py tests/test_kernels_gpu.py \
    -k "p_loop_sums or taps_same_bits or nan_filled or taps_do_not_change" > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests.log | cut -c1-300
mkdir -p $W/taps
timeout $((230 - SECONDS)) python3 benchmarks/bench.py --json $W/taps/benchmarks.json --budget-s 60 --commit $COMMIT \
    --peers none --settings lower_bound --shapes dense_H32_T16384 --taps-at lower_bound:dense_H32_T16384 \
    > $W/taps/bench.log 2>&1
echo "taps exit $? at $SECONDS s"; grep -E "^\[bench\] lower_bound_dense_H32" $W/taps/bench.log | cut -c1-300
