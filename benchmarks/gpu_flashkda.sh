#!/usr/bin/env bash
# --impl flashkda on the GPU machine in one call: build FlashKDA (upstream and the patched fork, in
# parallel), run tests/test_flashkda_adapter.py, `kdadbg run` and `kdadbg diff --impl flashkda` on
# lower-bound bf16 dumps (K = V = 128) for each build, a planted fault, and the second look at the
# fork's gate gradient. Everything lands in $OUT (default .out/flashkda). Expected ~6 min.
#   bash benchmarks/gpu_flashkda.sh [upstream] [fork]          (default: both)
# Needs .peer/ (ignored; carried) with flashkda-1ce47ea-src.tar.gz, flashkda-fork-bwd-src.tar.gz and
# nvidia_cutlass-4.2.0.0-py3-none-any.whl from shared/peer/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out/flashkda}
mkdir -p "$OUT"
builds=${*:-upstream fork}
mkdir -p /tmp/kdadbg_path && ln -sfn "$PWD/kernels" /tmp/kdadbg_path/kdadbg_kernels
base="$PWD:/tmp/kdadbg_path:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
status=0
kd() { PYTHONPATH="$tree:$base" python3 -m kdadbg "$@"; }
step() { echo "== $*" >&2; }

{ nvidia-smi; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$OUT/env.txt" 2>&1

step "build: $builds"
declare -A TREE
t0=$(date +%s)
for b in $builds; do
  ( MAX_JOBS=8 bash benchmarks/build_flashkda.sh "$b" .peer > "$OUT/build_$b.path" 2> "$OUT/build_$b.log" ) &
done
wait
for b in $builds; do
  line=$(tail -1 "$OUT/build_$b.path" 2>/dev/null)
  if [[ "$line" == export\ PYTHONPATH=* ]]; then
    TREE[$b]=$(echo "$line" | sed 's/^export PYTHONPATH=//; s/:\$PYTHONPATH$//')
    cp "${TREE[$b]}/build.log" "$OUT/build_${b}_setup.log" 2>/dev/null
  else
    echo "build $b failed: see $OUT/build_$b.log" >&2; status=1
  fi
done
echo "builds took $(( $(date +%s) - t0 )) s" | tee "$OUT/build_time.txt" >&2

step "dumps"
D=$OUT/dumps; mkdir -p "$D"
tree=""
kd gen "$D/kimi_T4096.safetensors" --preset kimi --T 4096 --H 4 --K 128 --V 128 --force
kd gen "$D/random_T4096_h0.safetensors" --preset bf16 --T 4096 --H 4 --K 128 --V 128 --force
kd gen "$D/batched_h0_T512.safetensors" --preset basic --B 2 --T 512 --H 4 --K 128 --V 128 --dtype bfloat16 --force
kd gen "$D/varlen_short.safetensors" --preset varlen_short --H 4 --K 128 --V 128 --dtype bfloat16 --force
kd gen "$D/kimi_varlen.safetensors" --preset kimi_varlen --H 4 --K 128 --V 128 --force
kd gen "$D/kimi_c64.safetensors" --preset kimi_c64 --T 1024 --H 4 --K 128 --V 128 --force
dumps="kimi_T4096 random_T4096_h0 batched_h0_T512 varlen_short kimi_varlen kimi_c64"

for b in $builds; do
  tree=${TREE[$b]:-}
  [ -n "$tree" ] || continue
  step "$b: tests"
  PYTHONPATH="$tree:$base" python3 -m pytest -q tests/test_flashkda_adapter.py > "$OUT/${b}_tests.log" 2>&1 || status=1
  tail -3 "$OUT/${b}_tests.log" >&2
  for d in $dumps; do
    step "$b: run/diff $d"
    kd run "$D/$d.safetensors" --impl flashkda --device cuda --json "$OUT/${b}_run_$d.json" --force \
        > "$OUT/${b}_run_$d.txt" 2>&1
    echo "run $d exit $?" >> "$OUT/${b}_exit_codes.txt"
    kd diff "$D/$d.safetensors" --impl flashkda --device cuda --json "$OUT/${b}_diff_$d.json" --force \
        --plot "$OUT/${b}_diff_$d.png" > "$OUT/${b}_diff_$d.txt" 2>&1
    echo "diff $d exit $?" >> "$OUT/${b}_exit_codes.txt"
  done
  if [ "$b" = fork ]; then
    step "fork: planted fault (all_states of chunk 5 x 1.05 before the backward)"
    kd diff "$D/random_T4096_h0.safetensors" --impl benchmarks/flashkda_planted.py:planted --device cuda \
        --json "$OUT/fork_planted_diff.json" --force > "$OUT/fork_planted_diff.txt" 2>&1
    echo "planted diff exit $?" >> "$OUT/fork_exit_codes.txt"
    for d in random_T4096_h0 kimi_T4096 varlen_short; do
      step "fork: second look $d"
      PYTHONPATH="$tree:$base" python3 benchmarks/flashkda_second_look.py "$D/$d.safetensors" \
          "$OUT/fork_second_look_$d.json" > "$OUT/fork_second_look_$d.txt" 2>&1 || status=1
    done
  fi
done
rm -rf "$D"   # regenerated from presets and seeds; not worth carrying back
python3 - "$OUT" <<'PY' > "$OUT/summary.txt" 2>&1
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("*_diff_*.json")) + sorted(out.glob("fork_planted_diff.json")):
    d = json.loads(f.read_text())
    print(f.name, d.get("verdict"), "first:", json.dumps(d.get("first_divergence")), "first_bug:", json.dumps(d.get("first_bug")), "origin:", json.dumps(d.get("origin")), "notes:", d.get("notes"))
for f in sorted(out.glob("*_run_*.json")):
    d = json.loads(f.read_text())
    print(f.name, d.get("verdict"), {t["name"]: t["ratio"] for t in d.get("tensors", [])})
PY
cat "$OUT/summary.txt" >&2
exit $status
