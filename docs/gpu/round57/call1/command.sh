# Round 57 call 1 (.peer in carry; COMMIT=<sha> LIMIT=<seconds> bash docs/gpu/round57/call1/command.sh): issue
# 23's whole benchmark at one commit. While upstream FlashKDA builds on the CPUs, kernel by kernel: the
# lower-bound forward at H64 T8192 (the shape it missed on an H100) and forward + backward at H32 T16384 with
# every tap on for 64 chunks, launch by launch. Then the three settings against fla at the 10 shapes, the
# lower-bound one against FlashKDA too, and the taps pairs of TAPS_AT, most asked-for shapes first, under a
# budget.
export PYTHONUNBUFFERED=1
W=$OUT
LIMIT=${LIMIT:-590}
. benchmarks/gpu_env.sh fla
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
timeout 200 bash benchmarks/build_flashkda.sh upstream .peer > $W/flashkda_build.log 2>&1 &
bpid=$!
timeout 60 python3 benchmarks/kernel_profile.py --H 64 --T 8192 --settings lower_bound --iters 3 \
    --json $W/profile_lb_H64.json > $W/profile_lb_H64.log 2>&1
echo "profile H64 exit $? at $SECONDS s"
grep -A8 "^forward, kernel time" $W/profile_lb_H64.log | cut -c1-200
timeout 60 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound --iters 3 --taps-window 64 \
    --per-launch --json $W/profile_lb_H32_taps.json > $W/profile_lb_H32_taps.log 2>&1
echo "profile taps exit $? at $SECONDS s"
grep -m1 "kernel time per fwd" $W/profile_lb_H32_taps.log | cut -c1-300
wait $bpid; echo "flashkda build exit $? at $SECONDS s"; tail -1 $W/flashkda_build.log | cut -c1-200
tail -1 $W/flashkda_build.log > .peer/fk_env.sh
. .peer/fk_env.sh
timeout $((LIMIT - SECONDS - 15)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((LIMIT - SECONDS - 60)) \
    --commit $COMMIT --peers fla,flashkda --settings ${SETTINGS:-lower_bound,softplus,pregated} --taps-at ${TAPS_AT:-} \
    --shapes dense_H64_T8192 dense_H32_T16384 dense_H16_T16384 varlen_mixed6_H32 dense_H16_T8192 \
    dense_H32_T8192 dense_H64_T16384 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 > $W/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/bench.log | cut -c1-330 | tail -40
