# Round 25 call 6 (a fresh machine; COMMIT=<sha> bash docs/gpu/round25/call6/command.sh): the taps-on ratio
# after the stored taps' buffers became one NaN fill, five off/on pairs at pre-gated H16 and H32 T16384.
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
export PYTHONPATH="$PWD:/tmp/kdadbg_path" PYTHONUNBUFFERED=1
{ nvidia-smi; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > $OUT/env.txt 2>&1
timeout 170 python3 benchmarks/bench.py --json $OUT/benchmarks.json --budget-s 140 --commit $COMMIT --peers none \
    --settings pregated --shapes dense_H16_T16384 dense_H32_T16384 --taps-repeats 5 \
    --taps-at pregated:dense_H16_T16384 pregated:dense_H32_T16384 > $OUT/bench.log 2>&1
echo "bench exit $?"
python3 -c "
import json; d = json.load(open('$OUT/benchmarks.json'))
for r in d['results']: print(r['name'], r['runs']['ours'].get('fwdbwd_ms'), r.get('taps_fwdbwd_ms'), [round(x, 3) for x in r.get('taps_ratios', [])])"
