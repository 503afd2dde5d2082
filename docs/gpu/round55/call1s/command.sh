# Round 55 call 1, short (.peer in carry; COMMIT=<sha> bash docs/gpu/round55/call1s/command.sh): call 1 cut to the
# device time left: S in bf16 and the l2norm as row scales (S_BF16=1, ROWSCALE_BF16=1, both off by default)
# beside the defaults at lower-bound H32 T16384 and H64 T8192 against fla, in one process; their CUDA bits tests.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh fla
ON=KDADBG_S_BF16=1,KDADBG_ROWSCALE_BF16=1
timeout 150 python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s 90 --commit $COMMIT --peers fla \
    --settings lower_bound --ab $ON --shapes dense_H32_T16384 dense_H64_T8192 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-230 | tail -6
KDADBG_S_BF16=1 KDADBG_ROWSCALE_BF16=1 timeout $((250 - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rfE \
    tests/test_kernels.py -k "row_scales_in_bf16 or s_in_bf16 or taps_do_not_change" > $W/bits_tests.log 2>&1
echo "bits tests exit $? at $SECONDS s"; tail -4 $W/bits_tests.log | cut -c1-300
