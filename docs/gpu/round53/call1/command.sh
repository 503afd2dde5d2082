# Round 53 call 1 (carry .peer and .exp; bash docs/gpu/round53/call1/command.sh): on an H200, issue 23's
# benchmark at today's kernels (30975fc, docs/gpu/round51/call2/command.sh: the three settings against fla at
# the 10 shapes, the taps pairs); on an H100 (today's kernels already measured there, round 51), the probe of
# branch exp/du0-on-main at da480f4 (round 52's exp/du0-in-state-pass on today's main, with RECB_DU0=3; its tree
# in the ignored .exp/ by `git archive da480f4 kernels kdadbg benchmarks tests docs/gpu/round53 pyproject.toml`):
# the branch's docs/gpu/round53/probe.sh.
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
if grep -q H200 $OUT/card.txt; then
    COMMIT=30975fc bash docs/gpu/round51/call2/command.sh
else
    cd .exp && LIMIT=570 bash docs/gpu/round53/probe.sh
fi
