# Round 41 call 3 (.peer in carry; warm after call 2, fla's autotuning at H16 lower-bound kept): the coherence
# bound in bf16 mode on fla's and our bf16 kernels at T 8192, H 16, K = V = 128 (probe.py).
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh fla
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 300 python3 docs/gpu/round41/call3/probe.py ${NAMES:-kimi fla_layer} > $W/probe.log 2>&1
echo "probe exit $? at $SECONDS s"; cat $W/probe.log | grep -v Warning | tail -8
