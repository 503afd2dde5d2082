# Round 48 call 3 (no carry; bash docs/gpu/round48/call3/command.sh): call 2's failing diff test again on CUDA,
# made device-agnostic (our correct bf16 kernels' head 1 dA_log is over its bar on an H100, not under the
# interpreter), with the other dA_log/ddt_bias carried-in and beside-a-bf16-dg diff tests, at 2 workers; then
# this round's dA_log/ddt_bias rule on model-size bf16 dumps with our op (dg returned in bf16): kimi and
# fla_layer resized to T 8192, H 16, K = V = 128, seeds 0 and 1, `kdadbg run` and `kdadbg diff --window 0`
# with --impl kdadbg_kernels:chunk_kda --precision bf16 on CUDA (runs/<dump>.run.json, .diff.json, .txt).
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
TESTS_TIMEOUT_S=200 TESTS_WORKERS=2 TESTS_SELECT='tests/test_diff.py -k "cannot_be_checked or carried or beside_a_dg"' \
    bash benchmarks/gpu_check.sh tests
echo "tests exit $? at $SECONDS s"; tail -3 $OUT/gpu_tests.log | cut -c1-300
export PYTHONPATH="$PWD:/tmp/kdadbg_path" PYTHONUNBUFFERED=1
mkdir -p $OUT/runs /tmp/dumps
for p in kimi fla_layer; do for s in 0 1; do
  d=/tmp/dumps/${p}_s$s.safetensors; n=$OUT/runs/${p}_s$s
  python3 -m kdadbg gen $d --preset $p --seed $s --T 8192 --H 16 --K 128 --V 128 > /dev/null
  timeout 100 python3 -m kdadbg run $d --impl kdadbg_kernels:chunk_kda --precision bf16 --device cuda \
      --json $n.run.json > $n.run.txt 2>&1; echo "$p seed $s run exit $? at $SECONDS s"
  timeout 120 python3 -m kdadbg diff $d --impl kdadbg_kernels:chunk_kda --precision bf16 --device cuda --window 0 \
      --json $n.diff.json > $n.diff.txt 2>&1; echo "$p seed $s diff exit $? at $SECONDS s"
  grep -h -E "sum not checkable|wrong sum|carried|^PASS|^FAIL|^UNREP" $n.run.txt | cut -c1-400
  grep -h -E "dA_log|ddt_bias|^verdict" $n.diff.txt | cut -c1-400
done; done
