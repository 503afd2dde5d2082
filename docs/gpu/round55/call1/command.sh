# Round 55 call 1 (no carry; bash docs/gpu/round55/call1/command.sh): the forward's per-chunk states S stored in
# bf16 (knob S_BF16, default 1 in bf16 mode; the backward's V pass reads them) against fp32 (S_BF16=0), kernel by kernel at
# lower-bound H32 T16384 and H64 T8192; then tests/test_kernels_gpu.py in one pytest process (round 54 call 7's
# three workers ran out of the GPU's memory).
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh
run() {  # name, then kernel_profile's arguments
    n=$1; shift
    timeout 150 python3 benchmarks/kernel_profile.py "$@" --ab KDADBG_S_BF16=0 --iters 5 --json $W/$n.json > $W/$n.log 2>&1
    echo "== $n exit $? at $SECONDS s"
    grep -E "^ours" $W/$n.log | sed -E 's/: first call.*kernel time per fwd/: fwd/; s/; host.*//' | cut -c1-200
}
run H32 --H 32 --T 16384 --settings lower_bound
run H64 --H 64 --T 8192 --settings lower_bound
grep -A30 "^forward+backward, kernel time" $W/H32.log | cut -c1-200
timeout $((570 - SECONDS)) python3 -m pytest -q -p no:cacheprovider --durations=10 -rfE tests/test_kernels_gpu.py \
    > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -15 $W/gpu_tests.log | cut -c1-300
