# Round 28 call 1 (a fresh machine, .peer in carry; bash docs/gpu/round28/call1/command.sh): kernel by
# kernel at H32 T16384, ours in the pre-gated and lower-bound settings with the intra/solve kernel in two
# walks over K (PREP_SOLVE_PASSES=2, at 1 and 2 warps) beside the default, and fla's kernels on the same
# inputs (from the autotune cache of earlier rounds); then the two-walk bits test on CUDA. Written to $W,
# packed in one tarball in $OUT.
export PYTHONUNBUFFERED=1
W=/tmp/call1; mkdir -p $W
{ nvidia-smi; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > $W/env.txt 2>&1
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
python3 -m pip install -q --no-index --no-deps --target $PWD/.peer/site .peer/fla_core-*.whl
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site" FLA_FLASH_KDA=0
export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache TRITON_CACHE_AUTOTUNING=1
mkdir -p $TRITON_CACHE_DIR
for f in docs/gpu/*/call*/autotune.tgz; do tar xzf $f -C $TRITON_CACHE_DIR; done
P="python3 benchmarks/kernel_profile.py --H 32 --iters 3"
timeout 200 $P --settings lower_bound,softplus --ab KDADBG_PREP_SOLVE_PASSES=2 \
    --ab KDADBG_PREP_SOLVE_PASSES=2,KDADBG_PREP_SOLVE_WARPS=2 --json $W/profile_ours_H32.json > $W/profile_ours_H32.log 2>&1
echo "profile ours exit $? at $SECONDS s"
for p in 1 2; do
    KDADBG_PREP_SOLVE_PASSES=$p timeout 100 $P --settings pregated --json $W/profile_pregated_passes$p.json \
        > $W/profile_pregated_passes$p.log 2>&1
    echo "profile pregated passes=$p exit $? at $SECONDS s"
done
tar czf $OUT/call1_ours.tgz -C $W . && echo "packed ours"
timeout $((470 - SECONDS)) $P --peer fla --settings pregated,lower_bound --json $W/profile_fla_H32.json \
    > $W/profile_fla_H32.log 2>&1
echo "profile fla exit $? at $SECONDS s"
tar czf $OUT/call1_fla.tgz -C $W profile_fla_H32.json profile_fla_H32.log && echo "packed fla"
TESTS_WORKERS=4 TESTS_TIMEOUT_S=$((570 - SECONDS)) OUT=$W TESTS_SELECT='tests/test_kernels.py -k "two_walks or k_blocks_in_programs"' \
    bash benchmarks/gpu_check.sh tests > $W/gpu_check.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -1 $W/gpu_tests.log | cut -c1-300
grep -E "FAILED|ERROR" $W/gpu_tests.log | head -10 | cut -c1-300
cp $W/gpu_tests.log $OUT/gpu_tests.log
grep -E "^(ours|fla) \[|intra|token|total" $W/profile_*.log | cut -c1-250 | head -80
