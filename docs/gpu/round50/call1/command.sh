# Ran at 3feb230 (its kernels as "new"; reverted after this call, docs/benchmarks.md "Issue 23's targets").
# Round 50 call 1 (carry .out/kernels_old: `git archive 6afc77d kernels`, the kernels before this round):
# the taps' NaN fills moved into the state passes (fill.py) and into one launch. The taps pairs (ours alone,
# bench.py) at pre-gated H16 T16384 and lower-bound H32 T16384 with this round's kernels, 6afc77d's and this
# round's again, in one process each on one GPU; the CUDA tests of the taps' bits and fills; this round's
# pre-gated H16 T16384 taps-on call launch by launch.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh
pair() {  # $1 label, $2 the kernels' folder
  mkdir -p /tmp/kp_$1 && ln -sfn "$2" /tmp/kp_$1/kdadbg_kernels
  PYTHONPATH="$PWD:/tmp/kp_$1" timeout 140 python3 benchmarks/bench.py --json $W/taps_$1.json --budget-s 100 \
      --commit $1 --peers none --settings pregated,lower_bound --shapes dense_H16_T16384 dense_H32_T16384 \
      --taps-at pregated:dense_H16_T16384 lower_bound:dense_H32_T16384 > $W/taps_$1.log 2>&1
  echo "taps $1 exit $? at $SECONDS s"; grep -E "taps on" $W/taps_$1.log | cut -c1-200
}
pair new "$PWD/kernels"
pair old "$PWD/.out/kernels_old"
pair new2 "$PWD/kernels"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py tests/test_kernels_bwd.py \
    tests/test_kernels.py -k "taps_do_not_change or nan_filled or dh0_slot or aliased_taps or fill" > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests.log | cut -c1-300
timeout $((585 - SECONDS)) python3 benchmarks/kernel_profile.py --H 16 --T 16384 --settings pregated --taps-window 64 \
    --per-launch --json $W/profile_pg_taps64.json > $W/profile_pg_taps64.log 2>&1
echo "profile exit $? at $SECONDS s"
