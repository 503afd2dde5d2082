# Round 49 call 4 (no carry; bash docs/gpu/round49/call4/command.sh): 616f785's decay note on CUDA at model size.
# fla_layer (fla's layer init, softplus gate, chunk 64, bf16) at T 8192, H 16, K = V = 128, seed 0, with the raw
# gate of token 1000 set to 8 in every head and channel (a decay of -exp(A_log) softplus(8 + dt_bias), past
# float32's exp in a 16-row block where exp(A_log) > 11): `run` and `diff --window 0` in bf16 mode on CUDA, and
# the same dump with do all NaN (a layer's own NaN come back through the loss) with `run --allow-nonfinite`:
# each should name the block past the limit (runs/*.txt, *.json).
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
. benchmarks/gpu_env.sh
export PYTHONPATH="$PWD:/tmp/kdadbg_path" PYTHONUNBUFFERED=1
mkdir -p $OUT/runs /tmp/dumps
python3 -m kdadbg gen /tmp/dumps/fl.safetensors --preset fla_layer --seed 0 --T 8192 --H 16 --K 128 --V 128 > /dev/null
python3 - <<'PY'
import torch
from safetensors import safe_open
from safetensors.torch import save_file
with safe_open("/tmp/dumps/fl.safetensors", "pt") as f:
    meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
t["g"][:, 1000] = 8.0
save_file(t, "/tmp/dumps/fl_g8.safetensors", meta)
t["do"] = torch.full_like(t["do"], float("nan"))
save_file(t, "/tmp/dumps/fl_g8_nando.safetensors", meta)
PY
timeout 150 python3 -m kdadbg run /tmp/dumps/fl_g8.safetensors --precision bf16 --device cuda --json $OUT/runs/run.json \
    > $OUT/runs/run.txt 2>&1; echo "run exit $? at $SECONDS s"
timeout 200 python3 -m kdadbg diff /tmp/dumps/fl_g8.safetensors --precision bf16 --device cuda --window 0 \
    --json $OUT/runs/diff.json > $OUT/runs/diff.txt 2>&1; echo "diff exit $? at $SECONDS s"
timeout 150 python3 -m kdadbg run /tmp/dumps/fl_g8_nando.safetensors --allow-nonfinite --precision bf16 --device cuda \
    --json $OUT/runs/run_nando.json > $OUT/runs/run_nando.txt 2>&1; echo "run (do NaN) exit $? at $SECONDS s"
grep -h -E "^note: NaN/Inf from|^PASS|^FAIL|^verdict|^first divergence" $OUT/runs/*.txt | cut -c1-600
