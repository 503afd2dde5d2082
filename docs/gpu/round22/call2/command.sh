# Round 22, call 2 (thirteenth session). From the repo root on the device machine, no carry.
# Call 1 showed the K pass's window launch issuing 32% more instructions (8096 against 6111 per warp) at
# the same rate, with spills (255 registers). Here: (1) the forward's tap-writing launches beside their
# taps-off form (token stage, intra/inverse, the taps-only output pass) and the V pass, with the base
# sections; (2) the K pass's window launch with source counters, exported per SASS instruction, to see
# which instructions its extra time sits on.
set -u
R=$OUT/r; mkdir -p "$R"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
mkdir -p /tmp/kdadbg_path && ln -sfn "$PWD/kernels" /tmp/kdadbg_path/kdadbg_kernels
export PYTHONPATH="$PWD:$PWD/benchmarks:/tmp/kdadbg_path" PYTHONUNBUFFERED=1
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats
   --section MemoryWorkloadAnalysis --section InstructionStats"
K="regex:kda_fwd_token_kernel|kda_fwd_intra_solve_kernel|kda_fwd_output_kernel|chunk_bwd_dqkg_v_kernel"
for w in 0 64; do
    # shellcheck disable=SC2086
    timeout 200 "$NCU" --clock-control none -k "$K" --launch-count 8 $S --csv --page details \
        python3 benchmarks/kernel_profile.py --H 16 --taps-window $w --iters 1 \
        > "$R/ncu_fwd_w$w.csv" 2> "$R/ncu_fwd_w$w.err"
    echo "fwd window $w: exit $?, $(wc -l < "$R/ncu_fwd_w$w.csv") lines"
done
for w in 0 64; do
    # the K pass's last launch (w 64: the window's; w 0: the whole pass) with per-instruction counters
    timeout 200 "$NCU" --clock-control none -k regex:chunk_bwd_dqkg_kernel --launch-skip $((w ? 1 : 0)) \
        --launch-count 1 --section SourceCounters --section WarpStateStats --import-source no \
        -o "$R/kpass_w$w" python3 benchmarks/kernel_profile.py --H 16 --taps-window $w --iters 1 \
        > "$R/kpass_w$w.log" 2>&1
    echo "kpass window $w: exit $?"
    timeout 100 "$NCU" -i "$R/kpass_w$w.ncu-rep" --page source --csv --print-source sass \
        > "$R/kpass_src_w$w.csv" 2> "$R/kpass_src_w$w.err"
    echo "source page: exit $?, $(wc -l < "$R/kpass_src_w$w.csv") lines"; head -c 600 "$R/kpass_src_w$w.csv"; echo
    timeout 100 "$NCU" -i "$R/kpass_w$w.ncu-rep" --page raw --csv > "$R/kpass_raw_w$w.csv" 2>&1
done
rm -f "$R"/*.ncu-rep
tar czf "$OUT/call2.tgz" -C "$R" .
