# Round 44 call 2 (no carry; bash docs/gpu/round44/call2/command.sh): the token kernel's launch at lower-bound
# H32 T16384, kernel by kernel (kernel_profile.py --ab, one process): round 44 call 1's Nsight Compute found it
# at 60 % of the DRAM bandwidth with 2 programs of 8 warps per SM (98 registers), 15 % of its warps' stalls at
# barriers (the cumsum's steps across warps) and 33 % waiting on global loads. Fewer warps per program (the
# row scan within fewer warps, more programs per SM), K blocks of 8 to 128, the loops' unrolling and loading
# ahead, a register cap.
export PYTHONUNBUFFERED=1
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
N="KDADBG_PREP_UNROLL=0,KDADBG_PREP_AHEAD=0"
timeout 500 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound --iters 5 \
    --ab KDADBG_PREP_MAXNREG=80 \
    --ab KDADBG_PREP_WARPS=4,$N --ab KDADBG_PREP_WARPS=2,$N --ab KDADBG_PREP_WARPS=1,$N \
    --ab KDADBG_PREP_WARPS=1,KDADBG_PREP_BK=8,$N --ab KDADBG_PREP_WARPS=2,KDADBG_PREP_BK=8,$N \
    --ab KDADBG_PREP_WARPS=4,KDADBG_PREP_BK=32,$N --ab KDADBG_PREP_WARPS=16,KDADBG_PREP_BK=128,$N \
    --ab KDADBG_PREP_WARPS=16,KDADBG_PREP_BK=32,$N --ab KDADBG_PREP_WARPS=4,KDADBG_PREP_UNROLL=2 \
    --ab KDADBG_PREP_WARPS=2,KDADBG_PREP_UNROLL=2 \
    --json $OUT/profile.json > $OUT/profile.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours|kda_fwd_token_kernel|^forward" $OUT/profile.log | cut -c1-250
