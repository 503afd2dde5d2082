# Round 34 call 4 (no carry): with the token kernel's loads ahead and unrolled loops as the default (call 3),
# L2 prefetches (tlmath.prefetch_l2) at the start of the token kernel (the raw gate's rows, PREP_PREFETCH=1)
# and of the backward K pass (the rows it reads after its block loops, DQKG_PREFETCH=1), kernel by kernel at
# lower-bound and softplus H32 T16384; then the launch-only knobs' bits test on CUDA at kimi_c64 (bf16).
export PYTHONUNBUFFERED=1
. benchmarks/gpu_env.sh
timeout 240 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound,softplus \
    --ab KDADBG_PREP_PREFETCH=1 --ab KDADBG_DQKG_PREFETCH=1 --ab KDADBG_PREP_UNROLL=0,KDADBG_PREP_AHEAD=0 \
    --json $OUT/profile_H32.json > $OUT/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -A7 "^forward, kernel time" $OUT/profile_H32.log | cut -c1-250
grep -A5 "^forward+backward, kernel time" $OUT/profile_H32.log | cut -c1-250
grep "^total\|^wall" $OUT/profile_H32.log | cut -c1-250
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "launch_only_knobs_of_the_prepare and kimi" \
    > $OUT/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $OUT/gpu_tests.log | cut -c1-300
