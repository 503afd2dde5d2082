# Round 54 call 1 (no carry; bash docs/gpu/round54/call1/command.sh): the forward token kernel at wider K
# blocks and more warps (launch knobs only; PREP_BK moves the l2norm's row sums' order), kernel by kernel at
# H32 T16384 lower-bound and softplus, each variant beside today's launch (BK 16, 8 warps, unrolled, ahead).
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh
A=KDADBG_PREP_BK=128,KDADBG_PREP_WARPS=32,KDADBG_PREP_UNROLL=1,KDADBG_PREP_AHEAD=0
B=KDADBG_PREP_BK=128,KDADBG_PREP_WARPS=16,KDADBG_PREP_UNROLL=1,KDADBG_PREP_AHEAD=0
C=KDADBG_PREP_BK=64,KDADBG_PREP_WARPS=16,KDADBG_PREP_UNROLL=2
D=KDADBG_PREP_BK=32,KDADBG_PREP_WARPS=16,KDADBG_PREP_UNROLL=4
E=KDADBG_PREP_BK=64,KDADBG_PREP_WARPS=32,KDADBG_PREP_UNROLL=2
timeout 400 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound,softplus \
    --ab $A --ab $B --ab $C --ab $D --ab $E --iters 5 --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"; grep -iE "token|^fwd|wall|variant|setting" $W/profile_H32.log | cut -c1-220 | tail -60
