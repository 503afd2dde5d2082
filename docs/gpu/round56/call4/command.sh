# Round 56 call 4 (.peer in carry; COMMIT=<sha> LIMIT=<seconds> bash docs/gpu/round56/call4/command.sh): the
# inference forward keeps the l2norm as row scales at chunk 64 too (prepare.rowscale_for_inference): its CUDA
# bits tests while upstream FlashKDA builds (on the CPUs); then issue 23's benchmark in the settings of
# SETTINGS (default lower_bound; call 2 timed the three against fla): against fla and, lower-bound, FlashKDA
# (ours' training and inference forwards, INFER_ROWSCALE=0 beside), the taps pairs of TAPS_AT (default none),
# most asked-for shapes first, under a budget.
export PYTHONUNBUFFERED=1
W=$OUT
LIMIT=${LIMIT:-560}
. benchmarks/gpu_env.sh fla
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
flashkda_start
timeout 140 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py tests/test_kernels_fwd.py \
    -k "inference_forward or normalised_qk" > $W/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $W/tests.log | cut -c1-300
flashkda_ready
timeout $((LIMIT - SECONDS - 15)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((LIMIT - SECONDS - 60)) \
    --commit $COMMIT --peers fla,flashkda --settings ${SETTINGS:-lower_bound} --ab-settings lower_bound \
    --ab KDADBG_INFER_ROWSCALE=0 --taps-at ${TAPS_AT:-} \
    --shapes dense_H64_T8192 dense_H32_T16384 dense_H16_T16384 varlen_mixed6_H32 dense_H16_T8192 \
    dense_H32_T8192 dense_H64_T16384 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-330 | tail -34
