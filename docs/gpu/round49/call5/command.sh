# Round 49 call 5 (no carry): the backward K pass's launch knobs with every tap on for chunks [0, 64), lower-bound
# H32 T16384, launch by launch: whether some launch makes its tapped window launch (0.428 ms for 64 chunks against
# 1.018 for the other 192 at pre-gated H16 on the H200, +26 % per chunk) cheaper, beside the untapped launch.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
. benchmarks/gpu_env.sh
timeout 480 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound --taps-window 64 --per-launch \
    --ab KDADBG_DQKG_WARPS=8 --ab KDADBG_DQKG_STAGES=2 --ab KDADBG_DQKG_LOOP_STAGES=2 --ab KDADBG_DQKG_MAXNREG=168 \
    --json $OUT/profile_dqkg_ab.json > $OUT/profile_dqkg_ab.log 2>&1
echo "exit $? at $SECONDS s"
grep -E "^ours \[|chunk_bwd_dqkg_kernel|failed" $OUT/profile_dqkg_ab.log | cut -c1-200
