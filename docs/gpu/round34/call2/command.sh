# Round 34 call 2 (no carry): do the state passes overlap with the kernels parallel over chunks on two streams?
# benchmarks/overlap_probe.py at lower-bound and pre-gated H32 T16384, H64 T8192, H16 T16384.
export PYTHONUNBUFFERED=1
. benchmarks/gpu_env.sh
for s in "--H 32 --T 16384" "--H 64 --T 8192" "--H 16 --T 16384"; do
    timeout 150 python3 benchmarks/overlap_probe.py $s --settings lower_bound,pregated 2>&1 | grep -v Warning
done | tee $OUT/overlap.log
