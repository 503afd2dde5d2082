# Round 55 call 1 (no carry; bash docs/gpu/round55/call1/command.sh): two changes to what the bf16 training forward
# stores, each against its knob off, kernel by kernel at lower-bound H32 T16384 and H64 T8192 (one process per
# shape): the per-chunk states S in bf16 (S_BF16=0: fp32) and the l2norm as row scales (ROWSCALE_BF16=0: the
# token kernel stores fp16 qn, kn). Then the CUDA bits tests of both and of the taps, and
# tests/test_kernels_gpu.py in one pytest process (round 54 call 7's three workers ran out of the GPU's memory).
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh
run() {  # name, then kernel_profile's arguments
    n=$1; shift
    timeout 170 python3 benchmarks/kernel_profile.py "$@" --ab KDADBG_S_BF16=0 --ab KDADBG_ROWSCALE_BF16=0 \
        --ab KDADBG_S_BF16=0,KDADBG_ROWSCALE_BF16=0 --iters 5 --json $W/$n.json > $W/$n.log 2>&1
    echo "== $n exit $? at $SECONDS s"
    grep -E "^ours" $W/$n.log | sed -E 's/: first call.*kernel time per fwd/: fwd/; s/; host.*//' | cut -c1-200
}
run H32 --H 32 --T 16384 --settings lower_bound
grep -A30 "^forward+backward, kernel time" $W/H32.log | cut -c1-220
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py \
    -k "row_scales_in_bf16 or s_in_bf16 or inference_forward_keeps or taps_do_not_change or aliased or u_and_du" \
    > $W/bits_tests.log 2>&1
echo "bits tests exit $? at $SECONDS s"; tail -4 $W/bits_tests.log | cut -c1-300
run H64 --H 64 --T 8192 --settings lower_bound
timeout $((580 - SECONDS)) python3 -m pytest -q -p no:cacheprovider --durations=10 -rfE tests/test_kernels_gpu.py \
    > $W/gpu_tests.log 2>&1
echo "gpu tests exit $? at $SECONDS s"; tail -15 $W/gpu_tests.log | cut -c1-300
