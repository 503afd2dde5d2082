# Round 38 call 1 (no carry; bash docs/gpu/round38/call1/command.sh): the tap buffers' NaN fills on the side
# stream with TAPS_STREAMS=1 (TapPlan.build's fill, and the backward's K-pass buffers beside its precompute and
# state pass). On CUDA: the taps bits tests (the side stream, a window beside other chunks and one over every
# chunk) and the launch-only knobs' bits test; per launch, taps on for chunks [0, 64) against TAPS_STREAMS=1 in
# one process (pre-gated H16 T16384, lower-bound H32 T16384) and taps off; bench.py's taps pairs with
# TAPS_STREAMS=1; and what the gate's derivative costs the backward K pass (stage_bench.py --dqkg-gates: the
# same inputs with GATE 0, 1, 2).
export PYTHONUNBUFFERED=1; W=$OUT; . benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_gpu.py \
    -k "launch_only_knobs_of_the_prepare or taps_do_not_change" > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests.log | cut -c1-300
timeout 60 python3 benchmarks/stage_bench.py --H 32 --T 16384 --dqkg-gates lower_bound,softplus > $W/stage_bench.log 2>&1
echo "stage_bench exit $? at $SECONDS s"; cut -c1-400 $W/stage_bench.log | tail -3
for cfg in "pregated 16" "lower_bound 32"; do
    set -- $cfg
    for tw in 0 64; do
        ab=$([ $tw = 0 ] || echo "--ab KDADBG_TAPS_STREAMS=1")
        timeout 90 python3 benchmarks/kernel_profile.py --H $2 --T 16384 --settings $1 --iters 10 \
            --taps-window $tw --per-launch $ab >> $W/profile_taps.log 2>&1
        echo "profile $1 H$2 taps $tw exit $? at $SECONDS s"
    done
done
grep -E "^ours \[" $W/profile_taps.log | cut -c1-300
KDADBG_TAPS_STREAMS=1 timeout $((560 - SECONDS)) python3 benchmarks/bench.py --json $W/benchmarks.json \
    --budget-s 100 --commit ${COMMIT:-HEAD} --peers none --settings pregated,lower_bound \
    --shapes dense_H16_T16384 dense_H32_T16384 \
    --taps-at pregated:dense_H16_T16384 lower_bound:dense_H32_T16384 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"; grep -E "^\[bench\]" $W/bench.log | cut -c1-300
