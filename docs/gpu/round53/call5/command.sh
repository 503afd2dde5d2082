# Round 53 call 5 (carry .peer; COMMIT=<sha> LIMIT=<seconds the device grants> bash docs/gpu/round53/call5/command.sh):
# on an H200, issue 23's benchmark at today's kernels (COMMIT, default a471cfc): the three settings against fla,
# shapes in round 51 call 2's priority order for as long as LIMIT allows (bench.py's wall budget LIMIT - 80 s;
# the JSON is rewritten after every run), the taps pairs. On any other card nothing (today's kernels were
# measured on an H100 in round 54), to keep the device time.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
grep -q H200 $W/gpu.txt || { echo "not an H200: nothing run"; exit 0; }
LIMIT=${LIMIT:-600}
. benchmarks/gpu_env.sh fla
timeout $((LIMIT - 25)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((LIMIT - 80)) \
    --commit ${COMMIT:-a471cfc} --peers fla --settings lower_bound,softplus,pregated \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 \
    --shapes dense_H32_T16384 dense_H64_T8192 dense_H16_T16384 varlen_mixed6_H32 dense_H16_T8192 \
    dense_H32_T8192 dense_H64_T16384 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-200 | tail -34
