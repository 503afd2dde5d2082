# Round 55 call 1 (.peer in carry; COMMIT=<sha> bash docs/gpu/round55/call1/command.sh): two changes to what the
# bf16 training forward stores, both knobs off by default until timed here: the per-chunk states S in bf16
# (S_BF16=1) and the l2norm as row scales (ROWSCALE_BF16=1; by default the token kernel stores fp16 qn, kn).
# Issue 23's lower-bound forward shapes against fla with the knobs on beside the defaults, in one process, and
# the taps pair; then the CUDA bits tests of both changes and of the taps with both knobs on; with time left,
# the kernels one by one at lower-bound H32 T16384.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh fla
ON=KDADBG_S_BF16=1,KDADBG_ROWSCALE_BF16=1
timeout 230 python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s 170 --commit $COMMIT --peers fla \
    --settings lower_bound --ab $ON --taps-at lower_bound:dense_H32_T16384 \
    --shapes dense_H32_T16384 dense_H64_T8192 varlen_mixed6_H32 dense_H64_T16384 dense_H32_T65536 \
    > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-230 | tail -12
KDADBG_S_BF16=1 KDADBG_ROWSCALE_BF16=1 timeout 130 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py \
    -k "row_scales_in_bf16 or s_in_bf16 or inference_forward_keeps or taps_do_not_change or aliased or u_and_du" \
    > $W/bits_tests.log 2>&1
echo "bits tests exit $? at $SECONDS s"; tail -4 $W/bits_tests.log | cut -c1-300
[ $SECONDS -lt 330 ] && timeout $((420 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --T 16384 \
    --settings lower_bound --ab $ON --iters 5 --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -A24 "^forward+backward, kernel time" $W/profile_H32.log | cut -c1-200
