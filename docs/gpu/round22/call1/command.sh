# Round 22, call 1 (thirteenth session; prepared in the twelfth). From the repo root on the device
# machine, no carry. Where the K pass's tap variant spends its extra time: its launch over the 64-chunk
# window took 0.591 ms against about 0.433 for a quarter of the taps-off pass at H16 T16384
# (round21/call2), and neither its in-loop tap products (round 21, call 2) nor its stores' bytes (0.027 ms
# at peak) account for that. Nsight Compute (KINDS.md: it read the counters on the Firecracker runtime;
# --clock-control none, as METHOD.md asks) on the K pass, taps off (two launches: two calls) and with
# every tap on for chunks [0, 64) (the launch outside the window, which NaN-fills the backward's tap
# buffers, then the window's). Compare the window launch with the taps-off one: issue-slot use, warp
# stall reasons, L1/L2/DRAM throughput, local-memory (spill) traffic.
set -u
R=$OUT/r; mkdir -p "$R"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"; [ -n "$NCU" ] && "$NCU" --version | tail -1
mkdir -p /tmp/kdadbg_path && ln -sfn "$PWD/kernels" /tmp/kdadbg_path/kdadbg_kernels
export PYTHONPATH="$PWD:$PWD/benchmarks:/tmp/kdadbg_path" PYTHONUNBUFFERED=1
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats
   --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis
   --section SourceCounters --section InstructionStats"
for w in 0 64; do
    # shellcheck disable=SC2086
    timeout 240 "$NCU" --clock-control none -k regex:chunk_bwd_dqkg_kernel --launch-count 2 $S --csv \
        --page details python3 benchmarks/kernel_profile.py --H 16 --taps-window $w --iters 1 \
        > "$R/ncu_kpass_w$w.csv" 2> "$R/ncu_kpass_w$w.err"
    echo "window $w: exit $?, $(wc -l < "$R/ncu_kpass_w$w.csv") csv lines"; tail -2 "$R/ncu_kpass_w$w.err"
done
tar czf "$OUT/call1.tgz" -C "$R" .
