# Round 55 call 1 (.peer in carry; COMMIT=<sha> bash docs/gpu/round55/call1/command.sh): two changes to what the
# bf16 training forward stores: the per-chunk states S in bf16 (knob S_BF16) and the l2norm as row scales
# (ROWSCALE_BF16; the token kernel stored fp16 qn, kn). Issue 23's lower-bound forward shapes against fla, with
# both knobs off in the same process (the kernels before), and the taps pair; the CUDA bits tests of both
# changes and of the taps; with the time left, the kernels one by one at lower-bound H32 T16384, both knobs
# off beside.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh fla
timeout 270 python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s 200 --commit $COMMIT --peers fla \
    --settings lower_bound --ab KDADBG_S_BF16=0,KDADBG_ROWSCALE_BF16=0 --taps-at lower_bound:dense_H32_T16384 \
    --shapes dense_H32_T16384 dense_H64_T8192 varlen_mixed6_H32 dense_H64_T16384 dense_H32_T65536 \
    > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-230 | tail -12
timeout 140 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py \
    -k "row_scales_in_bf16 or s_in_bf16 or inference_forward_keeps or taps_do_not_change or aliased or u_and_du" \
    > $W/bits_tests.log 2>&1
echo "bits tests exit $? at $SECONDS s"; tail -4 $W/bits_tests.log | cut -c1-300
[ $SECONDS -lt 470 ] && timeout $((585 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound \
    --ab KDADBG_S_BF16=0,KDADBG_ROWSCALE_BF16=0 --iters 5 --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -A24 "^forward+backward, kernel time" $W/profile_H32.log | cut -c1-200
