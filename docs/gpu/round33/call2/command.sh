# Round 33 call 2 (right after call 1, on the same machine, FlashKDA's build kept in .peer/, no carry): the intra
# kernel's pipeline stages at 3 (Triton's default) against the default 2 at H64 T8192, the training forward and
# the inference forward at chunk 64.
. benchmarks/gpu_env.sh; . .peer/fk_env.sh; timeout 100 python3 benchmarks/bench.py --json $OUT/benchmarks.json --budget-s 60 --commit 371792c --peers flashkda --settings lower_bound --shapes dense_H64_T8192 --taps-at --ab KDADBG_PREP_SOLVE_STAGES=3 > $OUT/bench.log 2>&1; echo "exit $? at $SECONDS"; grep -E "^\[bench\]" $OUT/bench.log | cut -c1-700
