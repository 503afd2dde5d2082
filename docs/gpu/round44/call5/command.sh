# Round 44 call 5 (.peer in carry; COMMIT=<sha> bash docs/gpu/round44/call5/command.sh): today's kernels (the
# backward's tap buffers NaN-filled by the backward state pass, the K pass without its fill variant): the CUDA
# tests of the fill and of the taps' bits; bench.py's taps pairs, ours alone, at pre-gated H16 T16384 and
# lower-bound H32 T16384; on an H200 also the three settings against fla at the seven shapes not yet timed
# there with EXP_FTZ (round 43 call 2's list), under a budget.
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh fla
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_bwd.py tests/test_kernels_gpu.py \
    -k "nan_filled or taps_do_not_change" > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests.log | cut -c1-300
mkdir -p $W/taps
timeout 150 python3 benchmarks/bench.py --json $W/taps/benchmarks.json --budget-s 60 --commit $COMMIT --peers none \
    --settings pregated,lower_bound --shapes dense_H16_T16384 dense_H32_T16384 \
    --taps-at pregated:dense_H16_T16384 lower_bound:dense_H32_T16384 > $W/taps/bench.log 2>&1
echo "taps exit $? at $SECONDS s"; grep -E "^\[bench\] (pregated_dense_H16|lower_bound_dense_H32)" $W/taps/bench.log | cut -c1-300
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    timeout $((560 - SECONDS)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((480 - SECONDS)) \
        --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
        --taps-at --shapes varlen_mixed6_H32 dense_H16_T8192 dense_H32_T8192 dense_H64_T16384 dense_H16_T65536 \
        dense_H32_T65536 dense_H64_T65536 > $W/bench.log 2>&1
    echo "bench exit $? at $SECONDS s"
    grep -E "^\[bench\]" $W/bench.log | cut -c1-230
fi
