#!/usr/bin/env bash
# GPU evidence for the adapters and capture, in one device call (~9 min), everything under $OUT:
#  1. fla KDAForCausalLM training steps captured with `kdadbg capture` and no change to the step's code
#     (softplus gate, lower-bound gate with safe_gate, GVA), each dump judged in one process: our kernels,
#     fla's own outputs from the step (its theirs file), fla rerun (`--impl fla`), bf16 tolerances;
#  2. the fla adapter's GPU tests and its planted fault (benchmarks/gpu_fla.py --parts tests,fault);
#  3. the FlashKDA fork (built in the background meanwhile): diff on a random lower-bound dump and the
#     planted fault, with the bf16-storage floors.
# fla's kernels take their first autotune config (KDADBG_FLA_FIRST_CONFIG=1, --first-config): judged,
# not timed. Needs .peer/ with the fla_core, flash_linear_attention and FlashKDA fork sources (carry it).
#   bash benchmarks/gpu_evidence.sh [T]      (T of the training steps, default 4096)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}; mkdir -p "$OUT"
T=${1:-4096}
L=/tmp/evidence; rm -rf "$L" /tmp/dumps; mkdir -p "$L"
mkdir -p /tmp/kdadbg_path && ln -sfn "$PWD/kernels" /tmp/kdadbg_path/kdadbg_kernels
( MAX_JOBS=8 bash benchmarks/build_flashkda.sh fork .peer > "$L/build_fork.path" 2> "$L/build_fork.log" ) &
build=$!
python3 -m pip install -q --no-index --no-deps --target /tmp/flasite .peer/fla_core-*.whl \
    .peer/flash_linear_attention-*.whl || exit 2
export PYTHONPATH="$PWD:/tmp/kdadbg_path:/tmp/flasite:${PYTHONPATH:-}" FLA_FLASH_KDA=0 KDADBG_FLA_FIRST_CONFIG=1 \
    PYTHONUNBUFFERED=1
S=$OUT/summary.txt; : > "$S"
for spec in "softplus --gate softplus" "lower_bound --gate lower_bound" "gva --gate softplus --heads 4 --v-heads 8"; do
    name=${spec%% *}; opts=${spec#* }; t0=$SECONDS
    timeout 150 python3 -m kdadbg capture --out "/tmp/dumps/$name" -- python3 benchmarks/fla_model_step.py \
        --T "$T" --first-config $opts > "$L/capture_$name.log" 2>&1
    echo "capture $name: exit $? in $((SECONDS - t0)) s: $(grep -c '\.safetensors' "$L/capture_$name.log") lines name a dump" >> "$S"
done
t0=$SECONDS
timeout 240 python3 benchmarks/gpu_judge_dumps.py /tmp/dumps "$L/judge" "$L/judge.txt"
echo "judge: exit $? in $((SECONDS - t0)) s" >> "$S"; cat "$L/judge.txt" >> "$S"
t0=$SECONDS
mkdir -p "$L/fla"; OUT=$L/fla timeout $((540 - SECONDS > 60 ? 540 - SECONDS - 60 : 30)) python3 benchmarks/gpu_fla.py --parts tests,fault \
    > "$L/gpu_fla.log" 2>&1
echo "gpu_fla tests,fault: exit $? in $((SECONDS - t0)) s" >> "$S"; tail -5 "$L/gpu_fla.log" >> "$S"
wait $build
tree=$(tail -1 "$L/build_fork.path" | sed 's/^export PYTHONPATH=//; s/:\$PYTHONPATH$//')
if [ -n "$tree" ] && [ $SECONDS -lt 500 ]; then
    D=/tmp/fkd; mkdir -p $D
    python3 -m kdadbg gen $D/random_T4096_h0.safetensors --preset bf16 --T 4096 --H 4 --K 128 --V 128 --force > /dev/null
    for what in "flashkda clean" "benchmarks/flashkda_planted.py:planted planted"; do
        impl=${what% *}; tag=${what#* }
        PYTHONPATH="$tree:$PYTHONPATH" timeout 60 python3 -m kdadbg diff $D/random_T4096_h0.safetensors --impl "$impl" \
            --device cuda --json "$L/fork_$tag.json" > "$L/fork_$tag.txt" 2>&1
        echo "fork diff $tag: exit $?" >> "$S"
        grep -E "first divergence|first BUG|introduced|inherited|compared" "$L/fork_$tag.txt" >> "$S"
    done
else
    echo "fork: not run (build: $(tail -2 "$L/build_fork.log" | tr '\n' ' '); $SECONDS s used)" >> "$S"
fi
echo "total $SECONDS s" >> "$S"
tar czf "$OUT/evidence.tgz" -C "$L" --exclude='*.safetensors' .
cat "$S"
