import os, sys, torch
os.environ["TRITON_INTERPRET"] = "1"
fuse = sys.argv[1]
os.environ["KDADBG_FWD_FUSE_WU"] = fuse
_empty = torch.empty
def nan_empty(*a, **k):
    t = _empty(*a, **k)
    if t.is_floating_point():
        t.fill_(float("nan"))
    return t
torch.empty = nan_empty
sys.path.insert(0, "tests")
from test_kernels import _two_heads, run_fb
from kdadbg.reference import run_reference
from kdadbg.compare import compare
for name in ("chunk64_varlen", "kimi_c64", "tail"):
    inputs, cfg = _two_heads(name)
    out, _, _ = run_fb(inputs, cfg, "bf16")
    ref = run_reference(inputs, cfg, taps=()).outputs
    bad = {n: (int(t.isnan().sum()), f"{compare(n, t.cpu(), ref[n]).ratio:.2e}") for n, t in out.items() if t is not None and (t.isnan().any() or compare(n, t.cpu(), ref[n]).ratio > 0.05)}
    print(f"fuse={fuse} {name}: {'all finite and near' if not bad else bad}", flush=True)
