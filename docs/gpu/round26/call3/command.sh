# Round 26 call 3 (a fresh machine, .peer in carry; COMMIT=<sha> bash docs/gpu/round26/call3/command.sh):
# upstream FlashKDA built first, with nothing else running (the taps pairs are bound by the host); (a) the
# taps pairs again with the aliased windows' fills one fill_ each (call 2 timed one torch._foreach_mul_ by
# NaN: 1.110 to 1.118 at H16); (b) the lower-bound setting at every shape with fla and FlashKDA: ours
# (chunk 64, 16), ours_infer (chunk 64, 16) and FlashKDA's forward; (c) ours_infer against
# KDADBG_INFER_ROWSCALE=0 at H32 and H64 T16384. Before (a): kernel_profile.py with the host's time per call
# and its cProfile, taps on and off; and kernel by kernel softplus against lower-bound at H32 T16384.
bash benchmarks/build_flashkda.sh upstream .peer > $OUT/flashkda_build.log 2>&1; tail -1 $OUT/flashkda_build.log > .peer/fk_env.sh
echo "build $SECONDS s"
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
python3 -m pip install -q --no-index --no-deps --target $PWD/.peer/site .peer/fla_core-*.whl
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site" FLA_FLASH_KDA=0 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache TRITON_CACHE_AUTOTUNING=1
mkdir -p $TRITON_CACHE_DIR $OUT/a $OUT/b $OUT/c
for f in docs/gpu/*/call*/autotune.tgz; do tar xzf $f -C $TRITON_CACHE_DIR; done
{ nvidia-smi; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > $OUT/env.txt 2>&1
# where a taps-on call's time goes on the host (pre-gated H16 T16384, taps on chunks [0, 64) and off)
for w in 64 0; do
    timeout 60 python3 benchmarks/kernel_profile.py --H 16 --taps-window $w --host-profile 30 \
        --json $OUT/profile_taps$w.json > $OUT/profile_taps$w.log 2>&1
    echo "profile taps $w exit $?"
done
# the lower-bound gate's forward costs 0.12 ms more than softplus at H32 T16384 (round 25): kernel by kernel
timeout 90 python3 benchmarks/kernel_profile.py --H 32 --settings softplus,lower_bound --iters 3 \
    --json $OUT/profile_gates_H32.json > $OUT/profile_gates_H32.log 2>&1
echo "profile gates exit $?"
timeout 120 python3 benchmarks/bench.py --json $OUT/a/benchmarks.json --budget-s 90 --commit $COMMIT --peers fla \
    --settings pregated --shapes dense_H16_T16384 --taps-at pregated:dense_H16_T16384 > $OUT/a/bench.log 2>&1
echo "bench a exit $?"
. .peer/fk_env.sh
timeout $((520 - SECONDS)) python3 benchmarks/bench.py --json $OUT/b/benchmarks.json --budget-s $((460 - SECONDS)) \
    --commit $COMMIT --peers fla,flashkda --settings lower_bound \
    --shapes dense_H16_T16384 dense_H32_T16384 dense_H64_T8192 dense_H16_T8192 dense_H32_T8192 dense_H64_T16384 \
             varlen_mixed6_H32 dense_H16_T65536 dense_H32_T65536 dense_H64_T65536 \
    --taps-at lower_bound:dense_H32_T16384 > $OUT/b/bench.log 2>&1
echo "bench b exit $?"
timeout $((590 - SECONDS)) python3 benchmarks/bench.py --json $OUT/c/benchmarks.json --budget-s $((560 - SECONDS)) \
    --commit $COMMIT --peers flashkda --settings lower_bound --shapes dense_H32_T16384 dense_H64_T16384 \
    --ab KDADBG_INFER_ROWSCALE=0 --ab-settings lower_bound > $OUT/c/bench.log 2>&1
echo "bench c exit $?"
tail -3 $OUT/flashkda_build.log | cut -c1-300
grep -E "^ours" $OUT/profile_taps*.log | cut -c1-400
grep -A14 "^forward, kernel time" $OUT/profile_gates_H32.log
grep -E "^\[bench\]" $OUT/a/bench.log $OUT/b/bench.log $OUT/c/bench.log | cut -c1-500
