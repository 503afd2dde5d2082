# Round 44 call 1 (.peer in carry; COMMIT=<sha> bash docs/gpu/round44/call1/command.sh): Nsight Compute on
# lower-bound H32 T16384 (ncu_step.py: the second forward+backward call's launches): the token kernel, the
# intra kernel and the K pass with taps off, then the K pass's two launches with every tap on for chunks
# [0, 64) (the window's tap-storing variant beside the NaN-filling one after it): where their time goes
# (full set: throughput, stall reasons, the SASS lines' samples; the text pages in ncu.tgz, the reports
# themselves stay there). Then, on an H200 only, round 43 call 2's
# bench (the H200's rows with EXP_FTZ at the shapes not yet timed with it there).
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh fla
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"; $NCU --version | tail -1
mkdir -p /tmp/ncu; cd benchmarks
timeout 200 $NCU --clock-control none --set full --import-source yes \
    --kernel-name regex:"kda_fwd_token_kernel|kda_fwd_intra_solve_kernel|chunk_bwd_dqkg_kernel" \
    --launch-skip 3 --launch-count 3 -o /tmp/ncu/ncu_notaps -f python3 ncu_step.py > /tmp/ncu/ncu_notaps.log 2>&1
echo "ncu taps off exit $? at $SECONDS s"
timeout 150 $NCU --clock-control none --set full --kernel-name regex:"chunk_bwd_dqkg_kernel" \
    --launch-skip 2 --launch-count 2 -o /tmp/ncu/ncu_taps -f python3 ncu_step.py --taps-window 64 > /tmp/ncu/ncu_taps.log 2>&1
echo "ncu taps on exit $? at $SECONDS s"
cd ..
for r in notaps taps; do
    $NCU -i /tmp/ncu/ncu_$r.ncu-rep --page details --print-units base > /tmp/ncu/ncu_${r}_details.txt 2>&1
    $NCU -i /tmp/ncu/ncu_$r.ncu-rep --page raw --csv > /tmp/ncu/ncu_${r}_raw.csv 2>&1
    $NCU -i /tmp/ncu/ncu_$r.ncu-rep --page source --csv --print-source sass > /tmp/ncu/ncu_${r}_sass.csv 2>&1
    echo "$r: $(wc -c < /tmp/ncu/ncu_${r}_details.txt) B details, $(wc -c < /tmp/ncu/ncu_${r}_sass.csv) B sass"
done
tail -3 /tmp/ncu/*.log; tar czf $W/ncu.tgz -C /tmp/ncu --exclude '*.ncu-rep' . ; ls -la /tmp/ncu $W
grep -E "^  [a-z_]+kernel|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Local Memory|Stall" \
    /tmp/ncu/ncu_notaps_details.txt /tmp/ncu/ncu_taps_details.txt | cut -c1-200 | head -80
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    timeout $((560 - SECONDS)) python3 benchmarks/bench.py --json $W/benchmarks.json --budget-s $((500 - SECONDS)) \
        --commit $COMMIT --peers fla --settings lower_bound,softplus,pregated \
        --taps-at --shapes varlen_mixed6_H32 dense_H16_T8192 dense_H32_T8192 dense_H64_T16384 dense_H16_T65536 \
        dense_H32_T65536 dense_H64_T65536 > $W/bench.log 2>&1
    echo "bench exit $? at $SECONDS s"
    grep -E "^\[bench\]" $W/bench.log | cut -c1-230
fi
