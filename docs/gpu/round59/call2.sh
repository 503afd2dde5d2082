# Round 59 call 2 (.peer in carry; COMMIT=<sha> LIMIT=<seconds> bash docs/gpu/round59/call2.sh): first the probe
# of the fused state pass (KDADBG_FWD_FUSE_WU=1) at 64 columns (H64's default V block), 32 (H32) and 16 (H16),
# with the INV product in other forms (REC_WU_MM 1: bf16, 3: transposed tf32, an mma.sync product) and with one
# stage, while upstream FlashKDA builds on the CPUs. Then, in the time left, lower-bound H64 against fla and
# FlashKDA with the knob beside in each form the probe found right at H64 (docs/gpu/round59/pick.py; the training
# forward and, beside FlashKDA, the inference forward), and the w/u kernel at 8 warps, 2 stages or 64-column
# blocks (the default forward misses 0.9 of fla's there by 0.7 %). REC_WU_MM was an experiment knob of b0c51a3's tree,
# removed after this call (the transposed form is now recurrence.wu_transposed): run it at b0c51a3.
export PYTHONUNBUFFERED=1
W=$OUT
LIMIT=${LIMIT:-480}
. benchmarks/gpu_env.sh fla
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
flashkda_start
PROBE_SETS="-;REC_WU_MM=3;REC_WU_MM=1;REC_STAGES=1" PROBE_CASES=kimi_H64_T2048,kimi_H32_T1024,kimi_H16_T1024 \
    LIMIT=${PROBE_LIMIT:-170} python3 docs/gpu/round59/probe_wu.py > $W/probe2.log 2>&1
echo "probe exit $? at $SECONDS s"; cat $W/probe2.log | cut -c1-250
AB=$(python3 docs/gpu/round59/pick.py $W/probe2.log kimi_H64_T2048 | head -3 | sed 's/^/--ab /' | tr '\n' ' ')
echo "right at H64: $AB"; echo "right in every case: $(python3 docs/gpu/round59/pick.py $W/probe2.log | tr '\n' ' ')"
flashkda_ready
if [ $((LIMIT - SECONDS)) -gt 90 ]; then
    timeout $((LIMIT - SECONDS - 10)) python3 benchmarks/bench.py --json $W/benchmarks.json \
        --budget-s $((LIMIT - SECONDS - 60)) --commit $COMMIT --peers fla,flashkda --settings lower_bound \
        $AB \
        --ab KDADBG_PREP_WU_WARPS=8 --ab KDADBG_PREP_WU_STAGES=2 --ab KDADBG_PREP_WU_BK=64 \
        --ab-settings lower_bound --shapes dense_H64_T8192 dense_H64_T16384 > $W/bench.log 2>&1
    echo "bench exit $? at $SECONDS s"
    grep -E "^\[bench\]" $W/bench.log | cut -c1-330 | tail -24
fi
