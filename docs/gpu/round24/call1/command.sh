# Round 24 call 1 (commit 6d1d903, .peer in carry): the whole GPU suite at the current defaults, upstream
# FlashKDA built beside it (for the next call's bench), then kernel_profile.py at H16 T16384 pre-gated:
# taps off, taps on for chunks [0, 64) per launch, and the forward state pass without the fused output
# (KDADBG_FWD_FUSE_OUT=0) and at V blocks of 32 (KDADBG_REC_BV=32).
(bash benchmarks/build_flashkda.sh upstream .peer > $OUT/flashkda_build.log 2>&1; tail -1 $OUT/flashkda_build.log > .peer/fk_env.sh) &
TESTS_WORKERS=8 TESTS_TIMEOUT_S=420 OUT=$OUT bash benchmarks/gpu_check.sh tests > /dev/null 2>&1
tail -5 $OUT/gpu_tests.log
export PYTHONPATH="$PWD:/tmp/kdadbg_path:$PWD/.peer/site" FLA_FLASH_KDA=0
{
  python3 benchmarks/kernel_profile.py --H 16
  python3 benchmarks/kernel_profile.py --H 16 --taps-window 64 --per-launch
  KDADBG_FWD_FUSE_OUT=0 python3 benchmarks/kernel_profile.py --H 16
  KDADBG_REC_BV=32 python3 benchmarks/kernel_profile.py --H 16
} 2>&1 | grep -v -e Warning -e _warn_once > $OUT/profiles_H16.log
wait
tail -3 $OUT/flashkda_build.log > $OUT/flashkda_build_tail.txt; cat .peer/fk_env.sh >> $OUT/flashkda_build_tail.txt
grep -E "^ours|^kernel|_kernel|fwd" $OUT/profiles_H16.log | head -80
