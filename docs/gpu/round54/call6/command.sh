# Round 54 call 6 (no carry; bash docs/gpu/round54/call6/command.sh): w and u formed by the forward intra kernel
# from INV's blocks in its registers (FWD_FUSE_WU=1, no w/u kernel) against the w/u kernel (=0): kernel by kernel
# at lower-bound H32 T16384, softplus H64 T8192 and pre-gated H16 T16384; which bits it moves (bits_ab.py, varlen
# lower-bound and dense softplus); the CUDA taps bits tests.
export PYTHONUNBUFFERED=1
W=$OUT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $W/gpu.txt
. benchmarks/gpu_env.sh
run() {  # name, then kernel_profile's arguments
    n=$1; shift
    timeout 150 python3 benchmarks/kernel_profile.py "$@" --ab KDADBG_FWD_FUSE_WU=0 --json $W/$n.json > $W/$n.log 2>&1
    echo "== $n exit $? at $SECONDS s"
    grep -E "^ours" $W/$n.log | sed -E 's/: H=.*kernel time per fwd/: fwd/; s/; host.*//' | cut -c1-200
    grep -E "^kda_fwd_(intra|wu)" $W/$n.log | head -4 | cut -c1-120
}
run lb_H32 --H 32 --T 16384 --settings lower_bound
run sp_H64 --H 64 --T 8192 --settings softplus
run pg_H16 --H 16 --T 16384 --settings pregated
for f in 0 1; do
    KDADBG_FWD_FUSE_WU=$f timeout 60 python3 benchmarks/bits_ab.py save $W/bits_sp_$f.safetensors --setting softplus --T 8192 --H 16 > /dev/null 2>&1
done
timeout 30 python3 benchmarks/bits_ab.py compare $W/bits_sp_0.safetensors $W/bits_sp_1.safetensors > $W/bits_sp.txt 2>&1
echo "bits (softplus H16 T8192) exit $?"; cat $W/bits_sp.txt | cut -c1-160; rm -f $W/bits_sp_*.safetensors
timeout $((560 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_gpu.py \
    -k "taps_do_not_change or aliased" > $W/gpu_tests.log 2>&1
echo "tests exit $? at $SECONDS s"; tail -3 $W/gpu_tests.log | cut -c1-300
