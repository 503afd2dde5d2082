# Round 55 call 4 (no carry; bash docs/gpu/round55/call4/command.sh): S in bf16 (S_BF16=1) again, now that the
# backward reads the bf16 S as it is (call 3: a conversion to fp32 took 0.415 ms), kernel by kernel at
# lower-bound H32 T16384 beside the defaults; its CUDA test.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh
timeout 60 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound --ab KDADBG_S_BF16=1 \
    --iters 3 --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -A26 "kernel time per call (ms) by setting" $W/profile_H32.log | cut -c1-200
timeout $((100 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py -k "test_s_in_bf16" \
    > $W/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $W/tests.log | cut -c1-300
