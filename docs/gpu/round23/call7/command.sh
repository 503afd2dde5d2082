# Call 7 (commit ca0e328, the machine of call 6 still warm: its .peer with FlashKDA's fork build): the
# benchmark, fla's autotune results of round 16 unpacked first; the autotune results after it saved.
source .peer/fk_env.sh
mkdir -p /tmp/tc && tar xzf docs/gpu/round16/call2/autotune.tgz -C /tmp/tc
TRITON_CACHE_DIR=/tmp/tc TRITON_CACHE_AUTOTUNING=1 BENCH_BUDGET_S=420 BENCH_ARGS="--commit ca0e328" OUT=$OUT \
    timeout 545 bash benchmarks/gpu_check.sh bench
(cd /tmp/tc && find . -name "*.autotune.json" | tar czf $OUT/autotune.tgz -T -)
