# Round 45 call 4 (no carry; bash docs/gpu/round45/call4/command.sh): the 19 tests that failed in call 3, again
# with 2 pytest workers where call 3 ran 8 (16 of them had refused to start for want of GPU memory that the other
# workers held, the kernels' and the reference's memory checks saying so), with the two mended since: the
# CPU-tensor refusal on a machine with a GPU (Triton's "cannot be accessed from Triton") and the dA_log-sum test
# judged on the heads whose bf16 floor is over the tolerance.
export PYTHONUNBUFFERED=1
W=$OUT
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mapfile -t ids < docs/gpu/round45/call4/tests.txt
timeout 560 python3 -m pytest -v -p no:cacheprovider -rfE --durations=10 -n 2 "${ids[@]}" > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -15 $W/gpu_tests.log | cut -c1-300
