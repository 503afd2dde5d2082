# Round 53 call 5 (carry .peer; bash docs/gpu/round53/call5/command.sh): on an H200, issue 23's benchmark at
# today's kernels (9d57d97, kernels as 30975fc: docs/gpu/round51/call2/command.sh, the three settings against
# fla at the 10 shapes, the taps pairs); on any other card nothing (today's kernels were measured on an H100 in
# round 51), to keep the device time.
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/card.txt
if grep -q H200 $OUT/card.txt; then
    COMMIT=9d57d97 bash docs/gpu/round51/call2/command.sh
else
    echo "not an H200: nothing run"
fi
