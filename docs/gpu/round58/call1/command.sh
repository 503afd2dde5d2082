# Round 57 call 1 (.peer in carry; COMMIT=<sha> LIMIT=<seconds> bash docs/gpu/round57/call1/command.sh): the
# forward without its w/u kernel (knob FWD_FUSE_WU=1: the state pass forms U = INV Diag(b) (v - kd S) from the
# token kernel's bf16 kd; at H32 INV a step ahead in registers, 3 pipeline stages, and with REC_INV_AHEAD=0 in
# the stages, 2), kernel by kernel beside the defaults at lower-bound H32 T16384 and H64 T8192, while upstream
# FlashKDA builds on the CPUs; its CUDA tests (the CPU cases on CUDA, and INFER_GC_FROM_G's); then, in what
# time is left, the lower-bound setting against fla and FlashKDA with the knob beside (the training and, beside
# FlashKDA, the inference forward at chunks 64 and 16), with INFER_GC_FROM_G=1 too (the inference forward
# storing no gc: the intra kernel forms it from the raw gate), and REC_BV=32 (the state pass's V blocks of 32:
# at chunk 16 two or three programs fit an SM), and with the knob on, the bf16 case table on the GPU.
export PYTHONUNBUFFERED=1
W=$OUT
LIMIT=${LIMIT:-420}
. benchmarks/gpu_env.sh fla
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
timeout 200 bash benchmarks/build_flashkda.sh upstream .peer > $W/flashkda_build.log 2>&1 &
bpid=$!
if [ -z "$SHORT" ]; then  # SHORT=1: no kernel-by-kernel profiles, the tests and the benchmark only
timeout 70 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound --iters 3 \
    --ab KDADBG_FWD_FUSE_WU=1 --ab KDADBG_FWD_FUSE_WU=1,KDADBG_REC_INV_AHEAD=0 \
    --json $W/profile_lb_H32.json > $W/profile_lb_H32.log 2>&1
echo "profile H32 exit $? at $SECONDS s"
grep -A8 "^forward, kernel time" $W/profile_lb_H32.log | cut -c1-200
grep -A14 "^forward+backward, kernel time" $W/profile_lb_H32.log | cut -c1-200
timeout 60 python3 benchmarks/kernel_profile.py --H 64 --T 8192 --settings lower_bound --iters 3 \
    --ab KDADBG_FWD_FUSE_WU=1 --json $W/profile_lb_H64.json > $W/profile_lb_H64.log 2>&1
echo "profile H64 exit $? at $SECONDS s"
grep -A8 "^forward, kernel time" $W/profile_lb_H64.log | cut -c1-200
fi
timeout 60 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py -k "fused_wu or inference_forms_gc" > $W/tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -2 $W/tests.log | cut -c1-300
wait $bpid; echo "flashkda build exit $? at $SECONDS s"; tail -1 $W/flashkda_build.log | cut -c1-200
tail -1 $W/flashkda_build.log > .peer/fk_env.sh
. .peer/fk_env.sh
if [ $((LIMIT - SECONDS)) -gt 60 ]; then
    timeout $((LIMIT - SECONDS - 10)) python3 benchmarks/bench.py --json $W/benchmarks.json \
        --budget-s $((LIMIT - SECONDS - 50)) --commit $COMMIT --peers fla,flashkda --settings lower_bound \
        --ab KDADBG_FWD_FUSE_WU=1 --ab KDADBG_FWD_FUSE_WU=1,KDADBG_INFER_GC_FROM_G=1 --ab KDADBG_REC_BV=32 \
        --ab-settings lower_bound --taps-at \
        --shapes dense_H64_T8192 dense_H32_T16384 dense_H64_T16384 varlen_mixed6_H32 dense_H32_T8192 > $W/bench.log 2>&1
    echo "bench exit $? at $SECONDS s"
    grep -E "^\[bench\]" $W/bench.log | cut -c1-330 | tail -24
fi
if [ $((LIMIT - SECONDS)) -gt 40 ]; then
    KDADBG_FWD_FUSE_WU=1 timeout $((LIMIT - SECONDS)) python3 -m pytest -q -p no:cacheprovider -rfE \
        tests/test_kernels_gpu.py -k "bf16_case_table" > $W/tests_gpu_fused.log 2>&1
    echo "gpu tests (FWD_FUSE_WU=1) exit $? at $SECONDS s"; tail -3 $W/tests_gpu_fused.log | cut -c1-300
fi
