# Round 51 call 1 (no carry; COMMIT=<sha> bash docs/gpu/round51/call1/command.sh): U and the completed dU
# stored in bf16 (knob UDU_BF16=1, the new default) against fp32 (=0, the storage before), ours alone in one
# process (bench.py --ab), the three settings at H32 T16384, H64 T8192 and the varlen batch, with the taps
# pair at lower-bound H32 T16384; the CUDA tests of the knob's bits and the taps; kernel by kernel at
# lower-bound H32 T16384 with and without it.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh
timeout 280 python3 benchmarks/bench.py --json $W/ab.json --budget-s 220 --commit $COMMIT --peers none \
    --settings lower_bound,softplus,pregated --ab KDADBG_UDU_BF16=0 --ab-settings lower_bound,softplus,pregated \
    --shapes dense_H32_T16384 dense_H64_T8192 varlen_mixed6_H32 --taps-at lower_bound:dense_H32_T16384 \
    > $W/ab.log 2>&1
echo "bench exit $? at $SECONDS s"; grep -E "ours|UDU|taps" $W/ab.log | grep -v "^\[bench\] (start|first)" | cut -c1-160 | tail -40
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_gpu.py \
    tests/test_kernels_bwd.py -k "u_and_du or mqk_in_bf16 or aliased or taps_do_not_change or dh0_slot" \
    > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests.log | cut -c1-300
timeout $((585 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound \
    --ab KDADBG_UDU_BF16=0 --json $W/profile_lb_H32.json > $W/profile_lb_H32.log 2>&1
echo "profile exit $? at $SECONDS s"; tail -30 $W/profile_lb_H32.log | cut -c1-200
