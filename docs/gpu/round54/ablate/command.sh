# Round 54, between calls 1 and 2 (carry .exp, where the script then was; the same H100, warm): the token kernel's
# ablation, twice (ablate1.log before the heads-first bit, ablate2.log after; token_ablate.py's docstring).
export W=$OUT; . benchmarks/gpu_env.sh; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 .exp/token_ablate.py 2>&1 | tee $OUT/ablate.log | tail -40
