# Round 42 call 2 (.peer in carry; bash docs/gpu/round42/call2/command.sh), right after call 1 on the same
# machine: ours (EXP_FTZ=1, the default) against fla in the three settings at H32 T16384, H64 T8192 and H16
# T16384, one process; ours with EXP_FTZ=0 alone at the same configurations in a second process; then the
# diff tests at model size and the planted faults (rounds 40-41's diff, not re-run since round 41 call 1).
export PYTHONUNBUFFERED=1
. benchmarks/gpu_env.sh fla
SHAPES="dense_H32_T16384 dense_H64_T8192 dense_H16_T16384"
KDADBG_EXP_FTZ=1 timeout 260 python3 benchmarks/bench.py --peers fla --settings lower_bound,softplus,pregated \
    --shapes $SHAPES --budget-s 230 --json $OUT/bench_ftz1.json > $OUT/bench_ftz1.log 2>&1
echo "bench EXP_FTZ=1 exit $? at $SECONDS s"
KDADBG_EXP_FTZ=0 timeout 100 python3 benchmarks/bench.py --peers none --settings lower_bound,softplus,pregated \
    --shapes $SHAPES --taps-at --budget-s 80 --json $OUT/bench_ftz0.json > $OUT/bench_ftz0.log 2>&1
echo "bench EXP_FTZ=0 exit $? at $SECONDS s"
grep -E "ratio|ours|fla" $OUT/bench_ftz1.log | tail -30 | cut -c1-200
tail -12 $OUT/bench_ftz0.log | cut -c1-200
timeout $((585 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py \
    -k "planted_fault_is_named or diff_is_quiet" > $OUT/gpu_tests_diff.log 2>&1
echo "diff tests exit $? at $SECONDS s"; tail -4 $OUT/gpu_tests_diff.log | cut -c1-300
