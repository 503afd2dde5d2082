# Round 17, call 2 (run from the repo root on the device machine): stage times with o formed in the
# state pass (bf16 default) against the output pass (KDADBG_FWD_FUSE_OUT=0), all with the state pass's
# inputs in bf16 (FWD_LOWP=15, the new default); accuracy of the defaults on test_kernels_gpu.py's large
# case; the GPU tests of the large cases and of the forward.
set -u
VARIANTS=benchmarks/variants_round17b.txt timeout 200 bash benchmarks/gpu_check.sh stages 2>&1 | tail -8
mkdir -p /tmp/kdadbg_path && ln -sfn "$PWD/kernels" /tmp/kdadbg_path/kdadbg_kernels
for p in bf16 fp32; do
    PYTHONPATH=/tmp/kdadbg_path:$PWD timeout 60 python3 benchmarks/accuracy_ab.py --precision $p --tag "default $p" \
        --json-lines "$OUT/accuracy.jsonl" 2>&1 | tail -2
done
TESTS_TIMEOUT_S=320 TESTS_SELECT="tests/test_kernels_gpu.py tests/test_kernels_fwd.py" bash benchmarks/gpu_check.sh tests 2>&1 | tail -8
