# Round 28 call 5 (no carry; COMMIT=<sha> bash docs/gpu/round28/call5/command.sh; its first run, without
# the two path lines below, found no kdadbg_kernels; they ran in the warm second call's command line): the
# taps-on ratio at the current defaults (the backward reading the forward's qd), ours only: every tap on
# for chunks [0, 64) against taps off, three separate pairs, at lower-bound H32 T16384 and pre-gated H16
# T16384 (bench/).
export PYTHONUNBUFFERED=1
mkdir -p /tmp/kdadbg_path && ln -sfn $PWD/kernels /tmp/kdadbg_path/kdadbg_kernels
export PYTHONPATH="$PWD:/tmp/kdadbg_path"
mkdir -p $OUT/bench
timeout 200 python3 benchmarks/bench.py --json $OUT/bench/benchmarks.json --budget-s 150 --commit $COMMIT \
    --peers none --settings lower_bound,pregated --shapes dense_H32_T16384 dense_H16_T16384 \
    --taps-at lower_bound:dense_H32_T16384 pregated:dense_H16_T16384 > $OUT/bench/bench.log 2>&1
echo "bench exit $? at $SECONDS s"
grep -E "^\[bench\]" $OUT/bench/bench.log | cut -c1-400
