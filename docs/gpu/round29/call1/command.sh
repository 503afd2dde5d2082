# Round 29 call 1 (no carry; COMMIT=<sha> bash docs/gpu/round29/call1/command.sh): where the forward's
# token / intra / WY kernels and the backward's V and K passes stall (Nsight Compute, lower-bound H32
# T16384: ncu_*.csv), the K pass's block loops pipelined (DQKG_LOOP_STAGES, launch-only: its bits test on
# CUDA, gpu_tests.log) and other one-knob candidates kernel by kernel (profile_H32.*).
W=/tmp/call1
. benchmarks/gpu_env.sh
export PYTHONPATH="$PYTHONPATH:$PWD/benchmarks"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats
   --section MemoryWorkloadAnalysis --section SchedulerStats"
K="regex:kda_fwd_token_kernel|kda_fwd_intra_solve_kernel|kda_fwd_wu_kernel|chunk_bwd_dqkg_v_kernel|chunk_bwd_dqkg_kernel"
# shellcheck disable=SC2086
timeout 200 "$NCU" --clock-control none -k "$K" --launch-skip 5 --launch-count 5 $S --csv --page details \
    python3 benchmarks/ncu_step.py > $W/ncu_lb_H32.csv 2> $W/ncu.err
echo "ncu exit $? at $SECONDS s, $(wc -l < $W/ncu_lb_H32.csv) lines"; tail -3 $W/ncu.err
TESTS_WORKERS=3 TESTS_TIMEOUT_S=120 OUT=$W TESTS_SELECT='tests/test_kernels_bwd.py -k loop_stages' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
timeout $((560 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --settings lower_bound,softplus --iters 3 \
    --ab KDADBG_DQKG_LOOP_STAGES=2 --ab KDADBG_DQKG_LOOP_STAGES=3 --ab KDADBG_DQKG_BK=16 \
    --ab KDADBG_DQKGV_BV=64 --ab KDADBG_DQKGV_STAGES=2 --ab KDADBG_PREP_WU_BK=64 \
    --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours \[" $W/profile_H32.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-250
cp $W/*.csv $W/*.log $W/*.json $W/env.txt $OUT/ 2>/dev/null; ls $OUT
