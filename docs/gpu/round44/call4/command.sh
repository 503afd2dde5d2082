# Round 44 call 4 (no carry; ran at 7d88a48: its TAPS_FILL_KPASS=2 is the default since, as TAPS_FILL_STATE=1): the backward's tap buffers
# NaN-filled by the backward state pass, a few blocks a chain step (KDADBG_TAPS_FILL_KPASS=2), against the K
# pass's launch over the chunks outside the window (1, the default; round 44 call 1: that launch 9 % slower per
# chunk than taps off's): bench.py's taps pairs, ours alone, at pre-gated H16 T16384 and lower-bound H32 T16384
# (a/: 1, b/: 2, c/: 1 again), taps on and off per launch with 2, and the CUDA tests of the fill and the bits.
export PYTHONUNBUFFERED=1
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for r in a:1 b:2 c:1; do
    d=${r%%:*}; v=${r##*:}; mkdir -p /tmp/$d
    KDADBG_TAPS_FILL_KPASS=$v timeout 150 python3 benchmarks/bench.py --json /tmp/$d/benchmarks.json --budget-s 60 \
        --commit $COMMIT --peers none --settings pregated,lower_bound --shapes dense_H16_T16384 dense_H32_T16384 \
        --taps-at pregated:dense_H16_T16384 lower_bound:dense_H32_T16384 > /tmp/$d/bench.log 2>&1
    echo "$d (TAPS_FILL_KPASS=$v) exit $? at $SECONDS s"
    grep -E "^\[bench\] (pregated_dense_H16|lower_bound_dense_H32)" /tmp/$d/bench.log | cut -c1-300
done
tar czf $OUT/bench.tgz -C /tmp a b c
KDADBG_TAPS_FILL_KPASS=2 timeout 120 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound \
    --taps-window 64 --per-launch > $OUT/profile_taps_state.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours \[|recurrence_bwd|dqkg|fill|nan" $OUT/profile_taps_state.log | cut -c1-200 | head -30
KDADBG_TAPS_FILL_KPASS=2 timeout $((560 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/test_kernels_bwd.py \
    tests/test_kernels_gpu.py -k "nan_filled or taps_do_not_change" > $OUT/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -4 $OUT/gpu_tests.log | cut -c1-300
