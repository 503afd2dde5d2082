# Round 35 call 3, prepared for a session with device time (.peer in carry, holding .peer/kernels_ba3b929, a
# copy of kernels/ at ba3b929: `mkdir -p .peer/kernels_ba3b929 && git archive ba3b929 kernels | tar -x
# --strip-components=1 -C .peer/kernels_ba3b929`; then COMMIT=<sha> bash docs/gpu/round35/call3/command.sh).
# Whether the host is the bound of the short calls, and what the host-side trims since ba3b929 (the tap
# window's tables made once per shape, the slot table copied once, plain-Python launch arithmetic;
# benchmarks/host_time.py) buy on the GPU: for today's kernels and ba3b929's, each in its own process,
# kernel by kernel with the host's time and profile at H16 T8192 (pre-gated, lower-bound) and taps on and
# off at pre-gated H16 T16384; then bench.py at H16 T8192 and T16384 in the three settings with the taps
# pairs at pre-gated H16 T16384 (ours alone). Also, on the GPU machine's own CPU (lscpu.txt), each tree's
# Python host time without the GPU (benchmarks/host_time.py: launches stubbed, then Triton's launch path
# under its stand-in driver), to set beside the host time kernel_profile.py measures with the GPU.
export PYTHONUNBUFFERED=1
. benchmarks/gpu_env.sh
[ -f .peer/kernels_ba3b929/chunk.py ] || { echo "no .peer/kernels_ba3b929 (see the header)"; exit 2; }
lscpu > $OUT/lscpu.txt 2>&1; grep -m1 "Model name" $OUT/lscpu.txt
for tree in kernels .peer/kernels_ba3b929; do
    tag=$(basename $tree); W=$OUT/$tag; mkdir -p $W
    ln -sfn "$PWD/$tree" /tmp/kdadbg_path/kdadbg_kernels
    timeout 120 python3 benchmarks/kernel_profile.py --H 16 --T 8192 --settings pregated,lower_bound --iters 20 \
        --host-profile 30 --json $W/profile_H16_T8192.json > $W/profile_H16_T8192.log 2>&1
    echo "$tag profile T8192 exit $? at $SECONDS s"; grep -E "^ours \[" $W/profile_H16_T8192.log | cut -c1-330
    for L in stub triton; do
        timeout 60 python3 benchmarks/host_time.py --iters 100 --settings pregated,lower_bound --launch $L > $W/host_time_$L.log 2>&1
        echo "$tag host_time $L exit $? at $SECONDS s"; cut -c1-110 $W/host_time_$L.log
    done
    for tw in 0 64; do
        timeout 90 python3 benchmarks/kernel_profile.py --H 16 --T 16384 --settings pregated --iters 20 \
            --taps-window $tw --host-profile 30 --json $W/profile_taps${tw}_H16.json > $W/profile_taps${tw}_H16.log 2>&1
        echo "$tag profile taps $tw exit $? at $SECONDS s"; grep -E "^ours \[" $W/profile_taps${tw}_H16.log | cut -c1-330
    done
    timeout 150 python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s 120 --commit ${COMMIT:-HEAD}-$tag \
        --peers none --settings pregated,softplus,lower_bound --shapes dense_H16_T8192 dense_H16_T16384 \
        --taps-at pregated:dense_H16_T16384 > $W/bench.log 2>&1
    echo "$tag bench exit $? at $SECONDS s"; grep -E "^\[bench\]" $W/bench.log | cut -c1-400
done
