# Round 16, call 4 (run from the repo root on the device machine, .peer and .ab in carry): accuracy of
# the backward K pass on 16-row blocks (DQKG_BLOCKED=1) against the code before it (.ab/k16) on
# test_kernels_gpu.py's chunk64_T8192_H16_kv case, fp32 and bf16 modes; the GPU tests and the benchmark
# (ours and fla in one process, fla's autotune results from call 2) at the code's defaults.
set -u
mkdir -p /tmp/kdadbg_path /tmp/old_path
ln -sfn "$PWD/kernels" /tmp/kdadbg_path/kdadbg_kernels
ln -sfn "$PWD/.ab/k16/kernels" /tmp/old_path/kdadbg_kernels
acc() { python3 benchmarks/accuracy_ab.py --json-lines "$OUT/accuracy.jsonl" "$@" 2>&1 | tail -2; }
for p in fp32 bf16; do
    PYTHONPATH=/tmp/old_path:$PWD acc --precision $p --tag "old $p"
    KDADBG_DQKG_BLOCKED=1 PYTHONPATH=/tmp/kdadbg_path:$PWD acc --precision $p --tag "blocked $p"
done
TESTS_TIMEOUT_S=260 TESTS_SELECT=tests/test_kernels_gpu.py bash benchmarks/gpu_check.sh tests 2>&1 | tail -6
mkdir -p /tmp/tc && tar xzf docs/gpu/round16/call2/autotune.tgz -C /tmp/tc
TRITON_CACHE_DIR=/tmp/tc TRITON_CACHE_AUTOTUNING=1 BENCH_BUDGET_S=70 BENCH_ARGS="--shapes varlen,dense --heads 32 16 --seqlens 16384 65536 4096 --taps-window 64" \
    timeout 130 bash benchmarks/gpu_check.sh bench 2>&1 | tail -10
