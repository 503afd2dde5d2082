#!/usr/bin/env bash
# Capture from a real fla training step on the GPU (no change to the step's code), then judge every
# dump: our kernels (`run`, bf16), fla's own outputs and gradients from that step (`diff --against` its
# theirs file, bf16 = fla's tolerances) and fla rerun on the dump (`run --impl fla`). Needs .peer/ with
# fla_core-0.6.0 and flash_linear_attention-0.6.0 wheels (carry it). Results: $OUT/capture_summary.txt
# and $OUT/capture.tgz (logs and JSON; the dumps stay on the machine).
#   bash benchmarks/gpu_capture.sh [T]      (default T 4096)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}; mkdir -p "$OUT"
T=${1:-4096}
mkdir -p /tmp/kdadbg_path && ln -sfn "$PWD/kernels" /tmp/kdadbg_path/kdadbg_kernels
python3 -m pip install -q --no-index --no-deps --target /tmp/flasite .peer/fla_core-*.whl \
    .peer/flash_linear_attention-*.whl || exit 2
export PYTHONPATH="$PWD:/tmp/kdadbg_path:/tmp/flasite:${PYTHONPATH:-}" FLA_FLASH_KDA=0 PYTHONUNBUFFERED=1
L=/tmp/caplogs; rm -rf "$L" /tmp/dumps; mkdir -p "$L"
S=$OUT/capture_summary.txt; : > "$S"
step() {  # name, then fla_model_step.py options
    local name=$1; shift
    local t0=$SECONDS
    python3 -m kdadbg capture --out "/tmp/dumps/$name" -- python3 benchmarks/fla_model_step.py --T "$T" \
        --first-config "$@" > "$L/$name.capture.log" 2>&1
    echo "capture $name: exit $? in $((SECONDS - t0)) s; $(grep -c safetensors "$L/$name.capture.log") lines naming dumps" >> "$S"
    for d in /tmp/dumps/$name/*.safetensors; do
        case "$d" in *.theirs.safetensors) continue ;; esac
        local b; b=$(basename "$d" .safetensors)
        python3 -m kdadbg inspect "$d" > "$L/$name.$b.inspect.log" 2>&1
        python3 -m kdadbg run "$d" --device cuda --precision bf16 --json "$L/$name.$b.run.json" > "$L/$name.$b.run.log" 2>&1
        local r1=$?
        python3 -m kdadbg diff "$d" --against "${d%.safetensors}.theirs.safetensors" --device cuda --precision bf16 \
            --json "$L/$name.$b.theirs.json" > "$L/$name.$b.theirs.log" 2>&1
        local r2=$?
        python3 -m kdadbg run "$d" --impl fla --device cuda --precision bf16 --json "$L/$name.$b.fla.json" \
            > "$L/$name.$b.fla.log" 2>&1
        local r3=$?
        echo "  $name/$b: ours run exit $r1; diff --against theirs exit $r2; run --impl fla exit $r3" >> "$S"
        python3 - "$L/$name.$b" >> "$S" <<'PY'
import json, sys
base = sys.argv[1]
for tag in ("run", "fla"):
    try:
        d = json.load(open(f"{base}.{tag}.json"))
        print(f"    {tag}: {d['verdict']}, " + ", ".join(f"{t['name']} {t['ratio']:.2e}" for t in d["tensors"]))
    except Exception as e:
        print(f"    {tag}: no JSON ({e})")
try:
    d = json.load(open(f"{base}.theirs.json"))
    fd = d["first_divergence"]
    print(f"    theirs: {d['verdict']}, compared {d['compared']['cells']} cells ({d['compared']['row_cells']} rows), "
          f"labels {[(k, d['compared'][k]) for k in ('ok', 'drift', 'bug', 'unrep')]}, first "
          f"{None if fd is None else (fd['tap'], fd['chunk'], fd['head'], fd['label'], round(fd['ratio'], 5))}")
except Exception as e:
    print(f"    theirs: no JSON ({e})")
PY
    done
}
step softplus --gate softplus
step lower_bound --gate lower_bound
step gva --gate softplus --heads 4 --v-heads 8
tar czf "$OUT/capture.tgz" -C "$L" .
cat "$S"
