# Round 52 call 1 (carry .peer and .exp; bash docs/gpu/round52/call1/command.sh): on an H200, issue 23's
# benchmark at today's kernels (537e4e4, docs/gpu/round51/call2/command.sh: the three settings against fla at
# the 10 shapes, the taps pairs); on an H100, the A/B of branch exp/du0-in-state-pass (b1ab8c1, its tree in
# the ignored .exp/ by `git archive b1ab8c1 kernels kdadbg benchmarks tests docs/gpu/round52 pyproject.toml`):
# dU0 formed by the backward state pass (KDADBG_RECB_DU0=1) against the precompute storing it, ours alone in
# one process, and the CUDA bits tests there (the branch's docs/gpu/round52/call1/command.sh). An H100 came.
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
if grep -q H200 $OUT/card.txt; then
    COMMIT=537e4e4 bash docs/gpu/round51/call2/command.sh
else
    cd .exp && COMMIT=b1ab8c1 bash docs/gpu/round52/call1/command.sh
fi
