# Round 36 call 2 (.peer in carry; COMMIT=<sha> bash docs/gpu/round36/call2/command.sh): whether the host bounds
# the short calls now. Today's kernels at H16 T8192 (pre-gated, lower-bound) kernel by kernel with the host's
# time and profile; our Python's host time on this machine's own CPU (host_time.py, launches stubbed, then
# Triton's launch path; lscpu.txt); the per-launch profile of the pre-gated H16 T16384 taps pair (where the
# taps' extra time goes, with the host's profile, and with the window's launches on a side stream,
# TAPS_STREAMS=1); then ours against fla at H16 T8192 and T16384 in the three
# settings with the two taps pairs (bench.py).
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh fla
lscpu > $W/lscpu.txt 2>&1; grep -m1 "Model name" $W/lscpu.txt
timeout 100 python3 benchmarks/kernel_profile.py --H 16 --T 8192 --settings pregated,lower_bound --iters 20 \
    --host-profile 30 --json $W/profile_H16_T8192.json > $W/profile_H16_T8192.log 2>&1
echo "profile T8192 exit $? at $SECONDS s"; grep -E "^ours \[" $W/profile_H16_T8192.log | cut -c1-330
for L in stub triton; do
    timeout 50 python3 benchmarks/host_time.py --iters 100 --settings pregated,lower_bound --launch $L \
        > $W/host_time_$L.log 2>&1
    echo "host_time $L exit $? at $SECONDS s"; cut -c1-110 $W/host_time_$L.log | tail -12
done
for tw in 0 64; do
    n=$([ $tw = 0 ] && echo notaps || echo taps)_H16; ab=$([ $tw = 0 ] || echo "--ab KDADBG_TAPS_STREAMS=1")
    timeout 100 python3 benchmarks/kernel_profile.py --H 16 --T 16384 --settings pregated --iters 10 \
        --taps-window $tw --per-launch --host-profile 30 $ab --json $W/profile_$n.json > $W/profile_$n.log 2>&1
    echo "profile $n exit $? at $SECONDS s"; grep -E "^ours \[" $W/profile_$n.log | cut -c1-330
done
timeout $((500 - SECONDS)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((420 - SECONDS)) \
    --commit ${COMMIT:-HEAD} --peers fla --settings pregated,softplus,lower_bound \
    --shapes dense_H16_T8192 dense_H16_T16384 --taps-at pregated:dense_H16_T16384 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-400
mkdir -p $W/lb
timeout $((590 - SECONDS)) python3 benchmarks/bench.py --json $W/lb/benchmarks.json --budget-s 60 \
    --commit ${COMMIT:-HEAD} --peers none --settings lower_bound --shapes dense_H32_T16384 \
    --taps-at lower_bound:dense_H32_T16384 > $W/lb/bench.log 2>&1
echo "bench lb exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/lb/bench.log | cut -c1-400
