# Round 57 call 1 (no carry; bash docs/gpu/round57/call1/command.sh): kernel by kernel, the lower-bound forward
# at H64 T8192 (the shape whose forward missed 0.9x fla on an H100 in round 56) with the forward's launch knobs
# beside the defaults (the state pass's V block and warps: at H64 it takes blocks of 64 columns, one program per
# chain and block, where H32 takes 32; the intra kernel's warps), and forward + backward at lower-bound H32
# T16384 with every tap on for 64 chunks, launch by launch (where the taps' 1.0 ms goes on this card).
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh
timeout 200 python3 benchmarks/kernel_profile.py --H 64 --T 8192 --settings lower_bound --iters 3 \
    --ab KDADBG_REC_BV=32 --ab KDADBG_REC_WARPS=8 --ab KDADBG_REC_BV=32,KDADBG_REC_STAGES=2 \
    --ab KDADBG_PREP_SOLVE_WARPS=2 --json $W/profile_lb_H64.json > $W/profile_lb_H64.log 2>&1
echo "profile H64 exit $? at $SECONDS s"
grep -A8 "^forward, kernel time" $W/profile_lb_H64.log | cut -c1-200
grep -A12 "^forward+backward, kernel time" $W/profile_lb_H64.log | cut -c1-200
timeout 100 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound --iters 3 --taps-window 64 \
    --per-launch --json $W/profile_lb_H32_taps.json > $W/profile_lb_H32_taps.log 2>&1
echo "profile taps exit $? at $SECONDS s"
grep -m1 "kernel time per fwd" $W/profile_lb_H32_taps.log | cut -c1-300
