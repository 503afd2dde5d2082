# Round 34 call 5 (no carry): with the K pass's L2 prefetch the default (call 4), L2 prefetches at the start of
# the backward precompute (Mqk's block, dO's rows: BPREP_PREFETCH=1) and of the finish kernel (k's and dkn's
# rows, beta: FINISH_PREFETCH=1), kernel by kernel at lower-bound H32 T16384 and pre-gated H16 T16384; then
# the launch-only knobs' bits test on CUDA at kimi_c64 (bf16).
export PYTHONUNBUFFERED=1
. benchmarks/gpu_env.sh
timeout 150 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound \
    --ab KDADBG_BPREP_PREFETCH=1 --ab KDADBG_FINISH_PREFETCH=1 --ab KDADBG_DQKG_PREFETCH=0 \
    --json $OUT/profile_H32.json > $OUT/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -A12 "^forward+backward, kernel time" $OUT/profile_H32.log | cut -c1-200
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "launch_only_knobs_of_the_prepare and kimi" \
    > $OUT/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $OUT/gpu_tests.log | cut -c1-300
