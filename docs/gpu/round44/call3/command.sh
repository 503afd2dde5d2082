# Round 44 call 3 (no carry; ran at be0a26b, whose knob BF16_ROWSCALE is gone since; bash docs/gpu/round44/call3/command.sh): bf16 mode's l2norm kept as row scales in
# training (knob BF16_ROWSCALE=1: the token kernel writes rq, rk [BT, H] instead of fp16 qn, kn [BT, H, K];
# every reader, forward and backward, rounds q * rq as the token kernel does), kernel by kernel against the
# default at lower-bound and softplus H32 T16384 in one process; which bits it moves (bits_ab.py, lower-bound
# H16 T8192: none expected).
export PYTHONUNBUFFERED=1
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 200 python3 benchmarks/kernel_profile.py --H 32 --T 16384 --settings lower_bound,softplus --iters 5 \
    --ab KDADBG_BF16_ROWSCALE=1 --json $OUT/profile.json > $OUT/profile.log 2>&1
echo "profile exit $? at $SECONDS s"
grep -E "^ours \[" $OUT/profile.log | cut -c1-330
sed -n '/^forward, kernel time/,$p' $OUT/profile.log | cut -c1-200
for v in 0 1; do
    for s in lower_bound softplus; do
        KDADBG_BF16_ROWSCALE=$v timeout 60 python3 benchmarks/bits_ab.py save /tmp/bits_${s}_$v.st --setting $s --T 8192 --H 16
    done
done
for s in lower_bound softplus; do
    python3 benchmarks/bits_ab.py compare /tmp/bits_${s}_0.st /tmp/bits_${s}_1.st > $OUT/bits_$s.log 2>&1
    echo "bits $s exit $? at $SECONDS s"; cat $OUT/bits_$s.log
done
