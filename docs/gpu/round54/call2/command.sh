# Round 54 call 2 (no carry; bash docs/gpu/round54/call2/command.sh): the kernels parallel over chunks and
# heads launched heads first (knob HEADS_FIRST=1, the new default) against the (chunks, heads) grid before
# (=0), kernel by kernel in one process per shape; the CUDA bits tests of the taps.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh
run() {  # name, then kernel_profile's arguments
    n=$1; shift
    timeout 200 python3 benchmarks/kernel_profile.py "$@" --ab KDADBG_HEADS_FIRST=0 --json $W/$n.json > $W/$n.log 2>&1
    echo "== $n exit $? at $SECONDS s"
    grep -E "^ours" $W/$n.log | sed -E 's/: first call.*kernel time per fwd/: fwd/; s/; host.*//' | cut -c1-200
}
run H32 --H 32 --T 16384 --settings lower_bound,softplus,pregated
run H64 --H 64 --T 8192 --settings lower_bound
run varlen --H 32 --varlen --settings lower_bound
run H16 --H 16 --T 16384 --settings pregated
grep -A40 "^forward+backward, kernel time" $W/H32.log | cut -c1-200
timeout $((560 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_gpu.py \
    tests/test_kernels_bwd.py -k "taps_do_not_change or aliased or dh0_slot or u_and_du" > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests.log | cut -c1-300
