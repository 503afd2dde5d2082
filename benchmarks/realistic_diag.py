"""Why a model-size realistic diff is not quiet: for each case × precision of tests/test_kernels_gpu.py's
REAL_GPU (T 8192, H 8, K = V = 128), the diff's counts, every failing cell that is not UNREP, and beside
each failing cell the ratio and floor of every quantity in the same chunk and head (which stage's error it
carries). For a failing exp-carrying tap (ki, dqd, dkd) also the exponent there: the reference's largest
-gc in the cell, our gc tap's largest absolute error in it, and the error of ki recomputed from our gc
(torch float32 exp) against our ki tap (the part due to the kernel's exp).

    python benchmarks/realistic_diag.py --device cuda --out diag.json fla_layer:fp32 kimi:fp32 ...
"""

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import torch   # noqa: E402

from test_kernels_gpu import _real_gpu   # noqa: E402

from kdadbg.diff import diff_dump   # noqa: E402
from kdadbg.impls import resolve_impl   # noqa: E402
from kdadbg.noise import EXP_NEG_GC_TAPS, LABELS, OK, UNREP   # noqa: E402


def _f(x):
    return None if x is None else float(f"{float(x):.4g}")


def exponent_look(inputs, cfg, prec, device, cells):
    """For failing ki cells: (chunk, head) -> exponent facts, from one tapped run on those chunks."""
    from kdadbg.impls.ours import run_kernels
    from kdadbg.reference import run_reference
    from kdadbg_kernels.taps import TapSelection

    if not cells:
        return {}
    lo, hi = min(c for c, _ in cells), max(c for c, _ in cells) + 1
    ref = run_reference(inputs, cfg, taps=("gc", "ki"), device=device)
    _, taps, _ = run_kernels(inputs, cfg, prec, device, taps=TapSelection(names=("gc", "ki", "kd"), chunks=(lo, hi)))
    out = {}
    for c, h in cells:
        n = int(ref.chunks.length[c])
        g_ref = ref.taps["gc"][c, h, :n].double()
        g_k = taps["gc"][c - lo, h, :n].double().to(g_ref.device)
        ki_k = taps["ki"][c - lo, h, :n].double().to(g_ref.device)
        ki_ref = ref.taps["ki"][c, h, :n].double()
        kn = (taps["kd"][c - lo, h, :n].double().to(g_ref.device) * torch.exp(-g_k))   # kn from our kd, our gc
        ki_from_gc = (kn.float() * torch.exp(-g_k.float())).double()
        rms = lambda t: float(t.pow(2).mean().sqrt())   # noqa: E731
        out[f"{c},{h}"] = {
            "max_neg_gc": _f((-g_ref).max()), "gc_max_abs_err": _f((g_k - g_ref).abs().max()),
            "ki_ratio": _f(rms(ki_k - ki_ref) / (rms(ki_ref) + 1e-8)),
            "ki_from_our_gc_ratio": _f(rms(ki_from_gc - ki_ref) / (rms(ki_ref) + 1e-8)),
            "ki_exp_part_ratio": _f(rms(ki_k - ki_from_gc) / (rms(ki_ref) + 1e-8)),
        }
    return out


def one(name, prec, device, limit, small=False):
    if small:   # the case table's CI size: a smoke test of this script on the CPU
        from kdadbg.cases import get_case, make_inputs
        inputs, cfg = make_inputs(get_case(name), seed=1)
    else:
        inputs, cfg = _real_gpu(name)
    t0 = time.time()
    res = diff_dump(inputs, cfg, resolve_impl("ours", prec, None), device=device, window=0, max_interpreter_s=1e9)
    rec = {"case": name, "precision": prec, "counts": res.counts(), "passed": res.passed,
           "wall_s": round(time.time() - t0, 1), "failing": [], "quantities": {}}
    for n, c in res.cells.items():
        bad = (c.label != OK) & (c.label != UNREP)
        fin = torch.isfinite(c.floor) if c.floor is not None else None
        rec["quantities"][n] = {
            "cells": int(c.label.numel()), "over_tol": int((c.ratio > c.tol).sum()),
            "labels": {LABELS[i]: int((c.label == i).sum()) for i in range(len(LABELS)) if int((c.label == i).sum())},
            "max_ratio": _f(c.ratio[torch.isfinite(c.ratio)].max()) if bool(torch.isfinite(c.ratio).any()) else None,
            "median_floor": _f(c.floor[fin].median()) if fin is not None and bool(fin.any()) else None,
            "max_floor": _f(c.floor[fin].max()) if fin is not None and bool(fin.any()) else None,
            # the ten largest ratios with their floors: how the tail sits against the tolerance
            "top": [[c.chunks[i // c.ratio.shape[1]], c.heads[i % c.ratio.shape[1]], _f(c.ratio.flatten()[i]),
                     _f(None if c.floor is None else c.floor.flatten()[i])]
                    for i in torch.nan_to_num(c.ratio, nan=-1.0, posinf=1e30).flatten().argsort(descending=True)[:10].tolist()],
            "tol": c.tol}
        for r, h in bad.nonzero().tolist():
            rec["failing"].append({"q": n, "chunk": c.chunks[r], "head": c.heads[h], "label": LABELS[int(c.label[r, h])],
                                   "ratio": _f(c.ratio[r, h]), "floor": _f(None if c.floor is None else c.floor[r, h]),
                                   "tol": c.tol, "max_abs": _f(c.max_abs[r, h]), "kernel": _f(c.kernel[r, h]),
                                   "reference": _f(c.reference[r, h])})
    rec["failing"] = rec["failing"][:limit]
    # the same chunk and head in every quantity
    for f in rec["failing"]:
        same = {}
        for n, c in res.cells.items():
            if f["chunk"] in c.chunks and f["head"] // c.group in c.heads:
                r, h = c.chunks.index(f["chunk"]), c.column(f["head"])
                same[n] = [_f(c.ratio[r, h]), _f(None if c.floor is None else c.floor[r, h]), LABELS[int(c.label[r, h])]]
        f["same_cell"] = same
    ki = [(f["chunk"], f["head"]) for f in rec["failing"] if f["q"] in EXP_NEG_GC_TAPS][:8]
    try:
        rec["exponent"] = exponent_look(inputs, cfg, prec, device, ki)
    except Exception as e:   # the look is extra: a failure of it is said, the rest kept
        rec["exponent"] = {"error": repr(e)}
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="CASE:PRECISION, e.g. fla_layer:fp32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--small", action="store_true", help="the case table's CI size instead of the model size")
    a = ap.parse_args()
    from devices import use_device

    use_device("realistic_diag.py", a.device,
                 cpu="--device cpu --small, the case table's CI size under the Triton interpreter")
    recs = []
    for spec in a.runs:
        name, prec = spec.split(":")
        rec = one(name, prec, a.device, a.limit, a.small)
        recs.append(rec)
        print(json.dumps({k: rec[k] for k in ("case", "precision", "counts", "passed", "wall_s")}), flush=True)
        Path(a.out).write_text(json.dumps(recs, indent=1))


if __name__ == "__main__":
    main()
