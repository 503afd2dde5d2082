# Round 48 call 3 (no carry; bash docs/gpu/round48/call3/command.sh): call 2's failing diff test again on CUDA,
# made device-agnostic (our correct bf16 kernels' head 1 dA_log is over its bar on an H100, not under the
# interpreter), with the other dA_log/ddt_bias carried-in and beside-a-bf16-dg diff tests, at 2 workers.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
TESTS_TIMEOUT_S=300 TESTS_WORKERS=2 TESTS_SELECT='tests/test_diff.py -k "cannot_be_checked or carried or beside_a_dg"' \
    bash benchmarks/gpu_check.sh tests
echo "tests exit $? at $SECONDS s"; tail -4 $OUT/gpu_tests.log | cut -c1-300
