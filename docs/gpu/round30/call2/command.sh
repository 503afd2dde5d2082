# Round 30 call 2 (no carry; COMMIT=<sha> bash docs/gpu/round30/call2/command.sh): after call 1 (the w/u
# kernel in one program 0.394 -> 0.350 ms; softplus's token kernel as one program of 16 warps 0.767 ->
# 0.681, lower-bound's 0.700 -> 0.950), the token kernel's warps, K blocks and split per gate and the
# one-program w/u kernel's warps and column block, kernel by kernel at H32 T16384 (profile_H32.*).
W=/tmp/call2
. benchmarks/gpu_env.sh
timeout $((570 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --settings lower_bound,softplus --iters 3 \
    --ab KDADBG_PREP_KSPLIT=0,KDADBG_PREP_WARPS=16 --ab KDADBG_PREP_KSPLIT=0,KDADBG_PREP_WARPS=16,KDADBG_PREP_BK=64 \
    --ab KDADBG_PREP_KSPLIT=0,KDADBG_PREP_WARPS=16,KDADBG_PREP_BK=16 --ab KDADBG_PREP_KSPLIT=1,KDADBG_PREP_WARPS=16 \
    --ab KDADBG_PREP_KSPLIT=0,KDADBG_PREP_WARPS=8,KDADBG_PREP_BK=16 \
    --ab KDADBG_PREP_WU_BOTH=1,KDADBG_PREP_WU_WARPS=8 --ab KDADBG_PREP_WU_BOTH=1,KDADBG_PREP_WU_BK=64 \
    --ab KDADBG_PREP_WU_BOTH=1,KDADBG_PREP_WU_WARPS=2 \
    --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours \[" $W/profile_H32.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-200
grep -E "^kda_fwd_(token|wu)" $W/profile_H32.log | tail -4
cp $W/*.log $W/*.json $W/env.txt $OUT/ 2>/dev/null; ls $OUT
