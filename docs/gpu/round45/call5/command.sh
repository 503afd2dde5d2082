# Round 45 call 5 (no carry; bash docs/gpu/round45/call5/command.sh): this round's host-side changes on CUDA: the
# NaN reach in diff --chunks' seeded windows (kdadbg diff on a dump with a NaN k, --chunks 2:6, --device cuda, and
# the CPU test beside it), diff A B's UNREP from A's gc (taps --source ours on CUDA), the output options' checks,
# the DRIFT wording and the amplification line.
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
d=$(mktemp -d)
python3 -m kdadbg gen $d/basic.safetensors --preset basic --T 128 > /dev/null
python3 - "$d" <<'PY'
import sys
from safetensors import safe_open
from safetensors.torch import load_file, save_file
d = sys.argv[1]
with safe_open(f"{d}/basic.safetensors", "pt") as f:
    meta = f.metadata()
t = load_file(f"{d}/basic.safetensors")
t["k"][0, 50, 0, 3] = float("nan")
save_file(t, f"{d}/nan.safetensors", metadata=meta)
PY
for precision in fp32 bf16; do
    python3 -m kdadbg diff $d/nan.safetensors --allow-nonfinite --chunks 2:6 --device cuda --precision $precision \
        --json $W/nan_chunks_$precision.json > $W/nan_chunks_$precision.log 2>&1
    echo "diff --chunks 2:6 ($precision) exit $?"; tail -3 $W/nan_chunks_$precision.log | cut -c1-250
done
timeout 400 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_verdicts.py tests/test_diff.py tests/test_bad_inputs.py \
    -k "seeded_window or float32_cannot_hold or drift_introduced or amplification_line or o1 or o2 or not_blamed" \
    > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests.log | cut -c1-300
