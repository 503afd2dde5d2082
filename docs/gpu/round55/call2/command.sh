# Round 55 call 2 (.peer in carry; COMMIT=<sha> LIMIT=<seconds the device grants> bash docs/gpu/round55/call2/command.sh):
# issue 23's benchmark at COMMIT's kernels (after call 1 has decided S_BF16 and ROWSCALE_BF16): the three settings against fla at the 10 shapes in
# round 51 call 2's priority order for as long as LIMIT allows (bench.py's wall budget LIMIT - 90 s; the JSON
# is rewritten after every run), the taps pairs.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
LIMIT=${LIMIT:-600}
. benchmarks/gpu_env.sh fla
timeout $((LIMIT - 30)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((LIMIT - 90)) \
    --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 \
    --shapes dense_H32_T16384 dense_H64_T8192 dense_H16_T16384 varlen_mixed6_H32 dense_H16_T8192 \
    dense_H32_T8192 dense_H64_T16384 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-200 | tail -34
