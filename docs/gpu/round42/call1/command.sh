# Round 42 call 1 (no carry; bash docs/gpu/round42/call1/command.sh): exp as ex2.approx.ftz in the bf16
# kernels (knob EXP_FTZ, read at import: one process per value) and the register caps of the token kernel and
# the K pass (PREP_MAXNREG, DQKG_MAXNREG), the token kernel at K blocks of 32 capped at 96 registers and the
# K pass at 8 warps beside, kernel by kernel at lower-bound H32 T16384; which bits EXP_FTZ moves (bits_ab.py)
# and the error ratios with every gate at its lower bound (accuracy_ab.py, bf16); then the bf16 case table,
# the large cases against the float64 reference and the taps bits on CUDA with EXP_FTZ=1.
export PYTHONUNBUFFERED=1
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
KDADBG_EXP_FTZ=0 timeout 90 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound \
    --json $OUT/profile_ftz0.json > $OUT/profile_ftz0.log 2>&1
echo "profile EXP_FTZ=0 exit $? at $SECONDS s"
KDADBG_EXP_FTZ=1 timeout 200 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound \
    --ab KDADBG_PREP_MAXNREG=80 --ab KDADBG_PREP_BK=32,KDADBG_PREP_MAXNREG=96 --ab KDADBG_DQKG_WARPS=8 \
    --ab KDADBG_DQKG_MAXNREG=168 --json $OUT/profile_ftz1.json > $OUT/profile_ftz1.log 2>&1
echo "profile EXP_FTZ=1 exit $? at $SECONDS s"
for f in 0 1; do grep -E "^ours \[|^(kda|chunk|recurrence)" $OUT/profile_ftz$f.log | cut -c1-250; done
for f in 0 1; do
    KDADBG_EXP_FTZ=$f timeout 60 python3 benchmarks/bits_ab.py save /tmp/bits$f.st --setting lower_bound --T 8192 --H 16
done
python3 benchmarks/bits_ab.py compare /tmp/bits0.st /tmp/bits1.st > $OUT/bits_ftz.log 2>&1
echo "bits exit $? at $SECONDS s"; cat $OUT/bits_ftz.log
for f in 0 1; do
    KDADBG_EXP_FTZ=$f timeout 90 python3 benchmarks/accuracy_ab.py --precision bf16 --dtype bfloat16 --gates lower \
        --tag EXP_FTZ=$f --json-lines $OUT/accuracy.jsonl > $OUT/accuracy_ftz$f.log 2>&1
    echo "accuracy EXP_FTZ=$f exit $? at $SECONDS s"; tail -12 $OUT/accuracy_ftz$f.log | cut -c1-200
done
KDADBG_EXP_FTZ=1 timeout $((480 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py \
    -k "bf16_case_table or (large_against_reference and bf16) or taps_do_not_change" > $OUT/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -4 $OUT/gpu_tests.log | cut -c1-300
