# Round 28 call 2 (a fresh machine, .peer in carry; COMMIT=<sha> bash docs/gpu/round28/call2/command.sh):
# bf16 mode's l2norm as row scales in training too (BF16_ROWSCALE=2) and the backward reading the
# forward's qd (BWD_FWD_OPERANDS=1), the new defaults. First their bits tests on CUDA, and the
# bf16 accuracy tests with the forward's w read too (BWD_FWD_OPERANDS=5); then the lower-bound and
# softplus settings at four shapes with fla beside, ours also at the old defaults (BF16_ROWSCALE=1,
# BWD_FWD_OPERANDS=0: fp32 qn, kn stored in training, the split token launch) and with
# BWD_FWD_OPERANDS=3 (krT too) and 5 (w too); then kernel by kernel at H32 T16384, the same variants and the
# split token launch over the row scales. Written to $W, packed in $OUT.
export PYTHONUNBUFFERED=1
W=/tmp/call2; mkdir -p $W/bench
{ nvidia-smi; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > $W/env.txt 2>&1
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
python3 -m pip install -q --no-index --no-deps --target $PWD/.peer/site .peer/fla_core-*.whl
TESTS_WORKERS=6 TESTS_TIMEOUT_S=120 OUT=$W \
    TESTS_SELECT='tests/test_kernels.py tests/test_kernels_fwd.py -k "bf16_row_scales or inference_forward or l2norm_as_row or normalised_qk_stored or k_blocks_in_programs or forward_operands or forward_w or taps_do_not_change"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "FAILED|ERROR" $W/gpu_tests.log | head -10 | cut -c1-300
cp $W/gpu_tests.log $OUT/gpu_tests.log
mkdir -p $W/w2
KDADBG_BWD_FWD_OPERANDS=5 TESTS_WORKERS=4 TESTS_TIMEOUT_S=100 OUT=$W/w2 \
    TESTS_SELECT='tests/test_kernels_gpu.py -k "bf16_case_table or (large_against_reference and bf16) or (taps_do_not_change and bf16)"' \
    bash benchmarks/gpu_check.sh tests > $W/w2/gpu_check.log 2>&1
echo "tests w2 exit $? at $SECONDS s"; tail -1 $W/w2/gpu_tests.log | cut -c1-300
grep -E "FAILED|ERROR" $W/w2/gpu_tests.log | head -10 | cut -c1-300
cp $W/w2/gpu_tests.log $OUT/gpu_tests_w2.log
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site" FLA_FLASH_KDA=0
export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache TRITON_CACHE_AUTOTUNING=1
mkdir -p $TRITON_CACHE_DIR
for f in docs/gpu/*/call*/autotune.tgz; do tar xzf $f -C $TRITON_CACHE_DIR; done
timeout $((480 - SECONDS)) python3 benchmarks/bench.py --json $W/bench/benchmarks.json --budget-s $((400 - SECONDS)) \
    --commit $COMMIT --peers fla --settings lower_bound,softplus \
    --shapes dense_H32_T16384 dense_H16_T16384 dense_H64_T8192 varlen_mixed6_H32 \
    --ab KDADBG_BF16_ROWSCALE=1,KDADBG_BWD_FWD_OPERANDS=0 --ab KDADBG_BWD_FWD_OPERANDS=3 --ab KDADBG_BWD_FWD_OPERANDS=5 \
    > $W/bench/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
tar czf $OUT/call2_bench.tgz -C $W . && echo "packed the bench"
timeout $((575 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --settings lower_bound,softplus --iters 3 \
    --ab KDADBG_BF16_ROWSCALE=1,KDADBG_BWD_FWD_OPERANDS=0 --ab KDADBG_BWD_FWD_OPERANDS=3 --ab KDADBG_BWD_FWD_OPERANDS=5 \
    --ab KDADBG_PREP_KSPLIT=1,KDADBG_PREP_WARPS=8 --json $W/profile_H32.json > $W/profile_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
tar czf $OUT/call2_profile.tgz -C $W profile_H32.json profile_H32.log && echo "packed the profile"
grep -E "^\[bench\]" $W/bench/bench.log | cut -c1-400
grep -E "^ours \[" $W/profile_H32.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-330
