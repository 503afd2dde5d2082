#!/usr/bin/env bash
# GPU evidence for the adapters and capture, in one device call (~8 min), everything under $OUT:
#  1. both FlashKDA builds (upstream, the patched fork) in the background;
#  2. the fla adapter's GPU tests and its planted fault (benchmarks/gpu_fla.py --parts tests,fault), in the
#     background, the fault on the kimi_c64 case dump of step 3;
#  3. the case table's realistic presets at a GPU size (fla_layer, kimi_c64: T 8192, H 8, K = V = 128, bf16);
#  4. fla KDAForCausalLM training steps captured with `kdadbg capture` and no change to the step's code
#     (softplus gate, lower-bound gate with safe_gate, GVA), T = $1 (default 4096);
#  5. every dump judged (benchmarks/gpu_judge_dumps.py): our kernels in bf16 and fp32 mode, the step's own
#     outputs (its theirs file), fla rerun (run and diff), and each FlashKDA build on the lower-bound dumps:
#     the accuracy table of the README comes from these JSON files (benchmarks/accuracy_table.py).
# fla's kernels take their first autotune config (KDADBG_FLA_FIRST_CONFIG=1, --first-config): judged,
# not timed. Needs .peer/ with the fla_core, flash_linear_attention wheels, the FlashKDA tarballs and the
# CUTLASS wheel of shared/peer/ (carry it).
#   bash benchmarks/gpu_evidence.sh [T]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}; mkdir -p "$OUT"
T=${1:-4096}
L=/tmp/evidence; D=/tmp/dumps;   # logs and JSON go back as $OUT/evidence.tgz (the device returns 8 files)
 rm -rf "$L" "$D"; mkdir -p "$L" "$D/cases"
mkdir -p /tmp/kdadbg_path && ln -sfn "$PWD/kernels" /tmp/kdadbg_path/kdadbg_kernels
for b in fork upstream; do
    ( MAX_JOBS=4 NVCC_THREADS=2 bash benchmarks/build_flashkda.sh $b .peer > "$L/build_$b.path" 2> "$L/build_$b.log" ) &
done
python3 -m pip install -q --no-index --no-deps --target /tmp/flasite .peer/fla_core-*.whl \
    .peer/flash_linear_attention-*.whl || exit 2
export PYTHONPATH="$PWD:/tmp/kdadbg_path:/tmp/flasite:${PYTHONPATH:-}" FLA_FLASH_KDA=0 KDADBG_FLA_FIRST_CONFIG=1 \
    PYTHONUNBUFFERED=1
S=$OUT/summary.txt; : > "$S"
size=(--T 8192 --H 8 --K 128 --V 128)
python3 -m kdadbg gen "$D/cases/fla_layer.safetensors" --preset fla_layer "${size[@]}" --force > /dev/null
python3 -m kdadbg gen "$D/cases/kimi_c64.safetensors" --preset kimi_c64 "${size[@]}" --force > /dev/null
mkdir -p "$L/fla"
( OUT=$L/fla timeout 420 python3 benchmarks/gpu_fla.py --parts tests,fault --fault-dump "$D/cases/kimi_c64.safetensors" \
    > "$L/gpu_fla.log" 2>&1; echo "gpu_fla tests,fault: exit $?" > "$L/gpu_fla.exit" ) &
fla_pid=$!
for spec in "softplus --gate softplus" "lower_bound --gate lower_bound" "gva --gate softplus --heads 4 --v-heads 8"; do
    name=${spec%% *}; opts=${spec#* }; t0=$SECONDS
    timeout 150 python3 -m kdadbg capture --out "$D/$name" -- python3 benchmarks/fla_model_step.py \
        --T "$T" --first-config $opts > "$L/capture_$name.log" 2>&1
    echo "capture $name: exit $? in $((SECONDS - t0)) s: $(grep -c '\.safetensors' "$L/capture_$name.log") lines name a dump" >> "$S"
done
t0=$SECONDS
timeout $((560 - SECONDS)) python3 benchmarks/gpu_judge_dumps.py "$D" "$L/judge" "$L/judge.txt" \
    --flashkda "fork=$L/build_fork.path" --flashkda "upstream=$L/build_upstream.path"
echo "judge: exit $? in $((SECONDS - t0)) s" >> "$S"; cat "$L/judge.txt" >> "$S"
wait $fla_pid; cat "$L/gpu_fla.exit" >> "$S"; tail -3 "$L/gpu_fla.log" >> "$S"
echo "total $SECONDS s" >> "$S"
tar czf "$OUT/evidence.tgz" -C "$L" --exclude='*.safetensors' --exclude='build-*' .
cat "$S"
