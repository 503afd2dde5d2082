# Round 34 call 3 (no carry): the token kernel's next K block loaded one step ahead (PREP_AHEAD=1) and its
# K-block loops unrolled (PREP_UNROLL=8), kernel by kernel at H32 T16384 in the three settings, then the
# launch-only knobs' bits test on CUDA (these two among them).
export PYTHONUNBUFFERED=1
. benchmarks/gpu_env.sh
timeout 300 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound,softplus,pregated \
    --ab KDADBG_PREP_AHEAD=1 --ab KDADBG_PREP_UNROLL=8 --ab KDADBG_PREP_AHEAD=1,KDADBG_PREP_UNROLL=8 \
    --json $OUT/profile_H32.json > $OUT/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -A12 "^forward, kernel time" $OUT/profile_H32.log | cut -c1-250
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "launch_only_knobs_of_the_prepare" \
    > $OUT/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $OUT/gpu_tests.log | cut -c1-300
