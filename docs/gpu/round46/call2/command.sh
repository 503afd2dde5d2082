# Round 46 call 2 (no carry; the same machine as call 1): the diff and verdict tests on CUDA after this round's
# host-side changes (the carried-in rule, diff A B, the plain grid, the absolute-rule mark), those that force
# --device cpu left out (a process that compiled the kernels for CUDA refuses the interpreter).
TESTS_SELECT="tests/test_diff.py tests/test_verdicts.py -k 'not cpu'" TESTS_TIMEOUT_S=420 bash benchmarks/gpu_check.sh tests
