# Round 55 call 3 (no carry; bash docs/gpu/round55/call3/command.sh; the device time left, about 250 s): which of
# the two knobs cost call 1s's forward + backward 0.46 ms: each alone beside the defaults, kernel by kernel, at
# lower-bound H32 T16384 (one process).
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh
timeout 130 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound --ab KDADBG_S_BF16=1 \
    --ab KDADBG_ROWSCALE_BF16=1 --iters 3 --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -A26 "kernel time per call (ms) by setting" $W/profile_H32.log | cut -c1-200
