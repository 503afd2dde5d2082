# Call 5 (2026-12-02, the working tree between 1691a9a and ca0e328: QK_ROWSCALE in both modes, PREP_BK 64,
# PREP_QK_BF16 0): the row-scale bits test on CUDA, then kernel_profile.py in three settings with knob variants.
export TESTS_SELECT="tests/test_kernels.py -k row_scales" TESTS_WORKERS=4 TESTS_TIMEOUT_S=200
export PROFILE_SHAPES="--H 32 --settings pregated,softplus,lower_bound --ab KDADBG_QK_ROWSCALE=0 --ab KDADBG_PREP_QK_BF16=1 --ab KDADBG_PREP_BK=32 --ab KDADBG_PREP_SOLVE_WARPS=2;--H 64 --T 8192 --settings pregated,lower_bound --ab KDADBG_QK_ROWSCALE=0"
OUT=$OUT timeout 570 bash benchmarks/gpu_check.sh tests profile
