# Round 17, call 5 (run from the repo root on the device machine, .peer in carry): launch variants of the
# forward token stage and WY products at H32 (stage_bench.py), the winners picked by pick_variants.py
# (more than 1% off fwd_prepare), then the benchmark with them at the shapes where the forward was
# within 4% of fla in call 4 (ours and fla in one process, fla's cached autotune results).
set -u
VARIANTS=benchmarks/variants_round17d.txt timeout 110 bash benchmarks/gpu_check.sh stages 2>&1 | tail -6
pick=$(python3 benchmarks/pick_variants.py "$OUT/stages.jsonl" --groups PREP_WARPS,PREP_BK PREP_WU_WARPS,PREP_WU_BK)
echo "picked: '${pick}'" | tee "$OUT/picked.txt"
mkdir -p /tmp/tc && tar xzf docs/gpu/round16/call2/autotune.tgz -C /tmp/tc
env $pick TRITON_CACHE_DIR=/tmp/tc TRITON_CACHE_AUTOTUNING=1 BENCH_BUDGET_S=110 \
    BENCH_ARGS="--shapes dense,varlen --heads 32 16 --seqlens 16384 65536 --taps-window 64" \
    timeout 150 bash benchmarks/gpu_check.sh bench 2>&1 | tail -9
