# Round 46 call 1 (.peer in carry; COMMIT=<sha> bash docs/gpu/round46/call1/command.sh): this round's host-side
# changes on CUDA (the carried-in rule beside a dg returned in bf16, diff's recorded precision and inspect's
# overrides, diff A B's notes, the export's explained overflow, the plain grid, --impl's signature check); then,
# where the card is an H200, round 45 call 1's benchmark (the three settings against fla at the 10 shapes of
# issue 23 and the taps pairs) with today's kernels (unchanged since d0ed738).
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh fla
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_diff.py tests/test_cli.py tests/test_tapsfile.py \
    tests/test_verdicts.py tests/test_impls.py tests/test_window.py \
    -k "bf16_is_not_a_bug or inspect_recommends or only_B_holds or exp_taps_overflow or non_finite_tap_outside or without_colours or raises_is_one_line or slow_interpreter or float32_dA_log or wrong_dA_log" \
    > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests.log | cut -c1-300
if grep -q H200 $W/gpu.txt; then
    timeout 300 python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((560 - SECONDS - 60)) \
        --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
        --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 \
        --shapes dense_H32_T16384 dense_H64_T8192 dense_H16_T16384 varlen_mixed6_H32 dense_H16_T8192 \
        dense_H32_T8192 dense_H64_T16384 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 > $W/bench.log 2>&1
    echo "bench exit $? at $SECONDS s"
    grep -E "^\[bench\]" $W/bench.log | cut -c1-230
else
    echo "not an H200: no benchmark (the H100's rows are round 45's, today's kernels)"
fi
