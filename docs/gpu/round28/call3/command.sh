# Round 28 call 3 (a fresh machine, no carry; bash docs/gpu/round28/call3/command.sh): which outputs and
# taps move with bf16 mode's row scales against fp32 qn, kn stored (call 2's bits test failed at chunk 64
# and with bf16 inputs), per case; counts of differing elements in probe.log.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
export PYTHONPATH="$PWD:/tmp/kdadbg_path"
timeout 300 python3 docs/gpu/round28/call3/probe.py kimi_c64 chunk64_varlen bf16 tail fla_layer kimi chunk32 \
    > $OUT/probe.log 2>&1
echo "probe exit $?"; cut -c1-1500 $OUT/probe.log
