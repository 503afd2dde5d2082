# Round 17, call 1 (run from the repo root on the device machine, .peer and .ab in carry):
# stage times of the forward with the state pass's inputs in bf16 (KDADBG_FWD_LOWP) at H16, H32 and
# the varlen batch; the accuracy of those variants on test_kernels_gpu.py's large case; the taps-on
# time of main against branch taps-dqd-kernel's kernels (.ab/taps/kernels) at H16 and H32 T16384.
set -u
VARIANTS=benchmarks/variants_round17.txt timeout 300 bash benchmarks/gpu_check.sh stages 2>&1 | tail -12
mkdir -p /tmp/kdadbg_path && ln -sfn "$PWD/kernels" /tmp/kdadbg_path/kdadbg_kernels
for m in 0 7 15; do
    KDADBG_FWD_LOWP=$m PYTHONPATH=/tmp/kdadbg_path:$PWD timeout 60 python3 benchmarks/accuracy_ab.py \
        --precision bf16 --tag "FWD_LOWP=$m" --json-lines "$OUT/accuracy.jsonl" 2>&1 | tail -2
done
for m in 0 15; do   # bf16 inputs, gates at the lower bound (-5 per token)
    KDADBG_FWD_LOWP=$m PYTHONPATH=/tmp/kdadbg_path:$PWD timeout 60 python3 benchmarks/accuracy_ab.py --dtype bfloat16 \
        --gates lower --precision bf16 --tag "FWD_LOWP=$m lower bf16" --json-lines "$OUT/accuracy.jsonl" 2>&1 | tail -2
done
for k in kernels .ab/taps/kernels; do
    tag=$(echo "$k" | tr -c 'a-z0-9\n' '_')
    OUT=$OUT/taps_$tag KERNELS_DIR=$k BENCH_ARGS="--peer none --shapes dense --heads 16 32 --seqlens 16384 --taps-window 64" \
        timeout 100 bash benchmarks/gpu_check.sh bench 2>&1 | tail -5
done
