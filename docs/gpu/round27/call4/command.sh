# Round 27 call 4 (a fresh machine, .peer in carry; COMMIT=<sha> bash docs/gpu/round27/call4/command.sh):
# the lower-bound setting again at every shape with fla and FlashKDA, now that the token kernel's split
# launch is the default only in training at chunk 64 (call 2 timed the inference forward and chunk 16 with
# it); FlashKDA built first with nothing else running. Then, kernel by kernel at lower-bound H32 T16384, the
# warps and stages of the other kernels never A/B'd (the backward K pass is 40 % of forward + backward).
# Written to $W, packed in two tarballs in $OUT (the bench's first, in case the call is cut).
export PYTHONUNBUFFERED=1
W=/tmp/call4; mkdir -p $W/lb
bash benchmarks/build_flashkda.sh upstream .peer > $W/flashkda_build.log 2>&1; tail -1 $W/flashkda_build.log > .peer/fk_env.sh
echo "flashkda built at $SECONDS s"; tail -1 $W/flashkda_build.log | cut -c1-200
{ nvidia-smi; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > $W/env.txt 2>&1
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
python3 -m pip install -q --no-index --no-deps --target $PWD/.peer/site .peer/fla_core-*.whl
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site" FLA_FLASH_KDA=0
export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache TRITON_CACHE_AUTOTUNING=1
mkdir -p $TRITON_CACHE_DIR
for f in docs/gpu/*/call*/autotune.tgz; do tar xzf $f -C $TRITON_CACHE_DIR; done
. .peer/fk_env.sh
timeout $((400 - SECONDS)) python3 benchmarks/bench.py --json $W/lb/benchmarks.json --budget-s $((330 - SECONDS)) \
    --commit $COMMIT --peers fla,flashkda --settings lower_bound --taps-at > $W/lb/bench.log 2>&1
echo "bench lower_bound exit $? at $SECONDS s"
tar czf $OUT/call4_bench.tgz -C $W . && echo "packed the bench"
timeout $((400 - SECONDS)) python3 benchmarks/kernel_profile.py --H 32 --settings lower_bound --iters 3 \
    --ab KDADBG_DQKG_WARPS=8 --ab KDADBG_DQKGV_WARPS=4 --ab KDADBG_DQKG_STAGES=2 --ab KDADBG_PREP_WU_WARPS=8 \
    --ab KDADBG_REC_WARPS=8 --ab KDADBG_RECB_WARPS=8 --json $W/profile_warps_H32.json > $W/profile_warps_H32.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^\[bench\]" $W/lb/bench.log | cut -c1-520
grep -E "^ours \[" $W/profile_warps_H32.log | sed 's/precision=bf16 varlen=False taps_window=0: //' | cut -c1-330
tar czf $OUT/call4_profile.tgz -C $W profile_warps_H32.json profile_warps_H32.log && echo "packed the profile"
