# Round 54 call 4 (no carry; bash docs/gpu/round54/call4/command.sh): launch knobs again now that the kernels
# run heads first, kernel by kernel at lower-bound H32 T16384 (one process, each variant beside the defaults).
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh
ab=""
for v in KDADBG_PREP_WARPS=4 KDADBG_PREP_BK=32,KDADBG_PREP_UNROLL=4 KDADBG_PREP_MAXNREG=80 \
    KDADBG_PREP_SOLVE_WARPS=2 KDADBG_PREP_SOLVE_STAGES=3 KDADBG_PREP_WU_WARPS=8 KDADBG_PREP_WU_BK=64 \
    KDADBG_PREP_WU_STAGES=2 KDADBG_DQKG_HEADS_FIRST=1 KDADBG_BPREP_WARPS=8 KDADBG_FINISH_WARPS=4 \
    KDADBG_DQKGV_WARPS=4; do ab="$ab --ab $v"; done
timeout 420 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound $ab --iters 5 \
    --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours" $W/profile_H32.log | sed -E 's/H=32 T=16384.*kernel time per fwd/: fwd/; s/; host.*//' | cut -c1-160
grep -B2 -A14 "^forward+backward, kernel time" $W/profile_H32.log | cut -c1-250
