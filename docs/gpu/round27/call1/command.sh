# Round 27 call 1 (a fresh machine, no carry; COMMIT=<sha> bash docs/gpu/round27/call1/command.sh): the two
# new launch-only forward knobs on CUDA, first their bits tests (PREP_KSPLIT, PREP_RS_READS) and the
# inference forward's, then kernel by kernel against the defaults: the in-kernel settings at H16 and H32
# T16384 (--ab: KSPLIT, RS_READS, both, KSPLIT with 2 and 8 warps) and pre-gated H32 with KSPLIT.
# Everything is written to $W and packed into one tarball in $OUT (the tool returns a limited number of files).
export PYTHONUNBUFFERED=1
W=/tmp/call1; mkdir -p $W
{ nvidia-smi; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > $W/env.txt 2>&1
TESTS_WORKERS=8 TESTS_TIMEOUT_S=200 OUT=$W \
    TESTS_SELECT='tests/test_kernels.py -k "k_blocks_in_programs or row_scales or inference_forward"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -2 $W/gpu_tests.log | cut -c1-300
grep -E "FAILED|ERROR" $W/gpu_tests.log | head -10 | cut -c1-300
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
export PYTHONPATH="$PWD:/tmp/kdadbg_path" TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache
AB="--ab KDADBG_PREP_KSPLIT=1 --ab KDADBG_PREP_RS_READS=1 --ab KDADBG_PREP_KSPLIT=1,KDADBG_PREP_RS_READS=1
    --ab KDADBG_PREP_KSPLIT=1,KDADBG_PREP_WARPS=2 --ab KDADBG_PREP_KSPLIT=1,KDADBG_PREP_WARPS=8"
for H in 32 16; do
    timeout $((500 - SECONDS)) python3 benchmarks/kernel_profile.py --H $H --settings softplus,lower_bound --iters 3 \
        $AB --json $W/profile_ab_H$H.json > $W/profile_ab_H$H.log 2>&1
    echo "profile H$H exit $? at $SECONDS s"
done
for v in 0 1; do
    KDADBG_PREP_KSPLIT=$v timeout $((560 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --iters 3 \
        > $W/profile_pregated_ksplit$v.log 2>&1
    echo "profile pregated KSPLIT=$v exit $? at $SECONDS s"
done
grep -E "^ours \[" $W/profile_*.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-330
grep -E "^kda_fwd_token_kernel|^kda_fwd_intra|^kda_fwd_wu" $W/profile_pregated_ksplit*.log | cut -c1-200
for f in $W/profile_ab_H*.log; do echo "== $f"; grep -A9 "^forward, kernel time" $f | cut -c1-260; done
tar czf $OUT/call1.tgz -C $W . && echo "packed $(ls $W | wc -l) entries"
