"""Which bits a numerics knob moves: ours' outputs and gradients in one process per variant, compared
element by element.

    python benchmarks/bits_ab.py save FILE [--setting lower_bound] [--T 8192] [--H 16] [--D 128]
    python benchmarks/bits_ab.py compare A B

``save``: one forward + backward of ``chunk_kda`` (bf16 mode, chunk 64) on ``bench.py``'s inputs of
``--setting`` (``peer_inputs.setting_inputs``, seed 0), the output ``o`` and every input's gradient written
to FILE (safetensors) with the knob overrides in effect (``KDADBG_*``, recorded in its metadata). Run it once
per variant, each in its own process (a knob read at import, such as ``EXP_FTZ``, cannot change within
one). ``compare``: per tensor, how many elements A and B hold, how many differ in any bit, the largest
|A - B| and, of the differing elements, the largest magnitude either holds; exit 1 when a tensor's shape
or dtype differs or a tensor is missing from either file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def save(a) -> int:
    import torch
    from safetensors.torch import save_file

    import kdadbg  # noqa: F401  (the kernels beside this checkout)
    from kdadbg_kernels.chunk import chunk_kda
    from kdadbg_kernels.tuning import overrides
    from peer_inputs import SETTINGS, setting_inputs

    x, _, do = setting_inputs(a.setting, a.T, a.H, a.D, a.device)
    o = chunk_kda(**x, **SETTINGS[a.setting], chunk_size=64, precision="bf16")[0]
    names = list(x)
    grads = torch.autograd.grad(o, [x[n] for n in names], do)
    out = {"o": o.detach()} | {f"d{n}": g for n, g in zip(names, grads)}
    out = {n: t.contiguous().cpu() for n, t in out.items()}
    meta = {"setting": a.setting, "shape": json.dumps([a.T, a.H, a.D]), "overrides": json.dumps(overrides())}
    save_file(out, a.file, metadata=meta)
    print(f"bits_ab: {a.file}: {len(out)} tensors, overrides {overrides() or 'none'}")
    return 0


def compare(a) -> int:
    import torch
    from safetensors import safe_open

    def load(path):
        with safe_open(path, "pt") as f:
            return {n: f.get_tensor(n) for n in f.keys()}, f.metadata()

    A, ma = load(a.a)
    B, mb = load(a.b)
    print(f"A {a.a}: overrides {ma.get('overrides')}; B {a.b}: overrides {mb.get('overrides')}")
    bad = 0
    total = diff = 0
    for n in sorted(set(A) | set(B)):
        if n not in A or n not in B:
            print(f"{n:8s} only in {'A' if n in A else 'B'}")
            bad = 1
            continue
        x, y = A[n], B[n]
        if x.shape != y.shape or x.dtype != y.dtype:
            print(f"{n:8s} shape/dtype {tuple(x.shape)} {x.dtype} against {tuple(y.shape)} {y.dtype}")
            bad = 1
            continue
        xf, yf = x.float(), y.float()
        ne = (x.view(torch.int16 if x.element_size() == 2 else torch.int32)
              != y.view(torch.int16 if y.element_size() == 2 else torch.int32))
        k = int(ne.sum())
        total += x.numel()
        diff += k
        if k:
            big = float(torch.maximum(xf[ne].abs(), yf[ne].abs()).max())
            print(f"{n:8s} {x.numel():>10d} elements, {k:>8d} differ: max |A-B| {float((xf - yf).abs().max()):.3e}, "
                  f"largest differing magnitude {big:.3e}")
        else:
            print(f"{n:8s} {x.numel():>10d} elements, the same bits")
    print(f"compared {total} elements in {len(set(A) & set(B))} tensors: {diff} differ")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("file")
    s.add_argument("--setting", default="lower_bound", choices=["pregated", "softplus", "lower_bound"])
    s.add_argument("--T", type=int, default=8192)
    s.add_argument("--H", type=int, default=16)
    s.add_argument("--D", type=int, default=128)
    s.add_argument("--device", default="cuda" if os.environ.get("TRITON_INTERPRET") != "1" else "cpu")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    a = ap.parse_args(argv)
    return save(a) if a.cmd == "save" else compare(a)


if __name__ == "__main__":
    sys.exit(main())
