"""Where a model-size fp32 ``dg`` row leaves its noise floor (GPU): for given chunk x head cells of a
REAL_GPU case (tests/test_kernels_gpu.py), the ``dg`` row of our kernels, of the float32 reference (the
floor) and of ``dg`` formed in float64 from each one's own ``dgc`` and ``dgT`` taps (the reverse cumsum
and the gate's derivative, kdadbg/reference.py's bwd_prepare), all against the float64 reference; and
the same cells in a seeded window (``diff --chunks``): the kernels started from the reference's ``S``
and ``dS``. Prints one JSON line per cell.
    python benchmarks/dg_probe.py kimi 177:0 448:1 [--device cuda]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def ratio(x, ref):
    from kdadbg.compare.metrics import compare

    return compare("dg", x, ref).ratio


def dg_from_taps(dgc, dgT, g, A_log, dt_bias, lb, gate):
    """dg of one chunk x head [C, K] in float64 from dgc [C, K], dgT [K] and the raw gate rows [C, K]."""
    dgam = torch.flip(torch.cumsum(torch.flip(dgc.double(), [0]), 0), [0]) + dgT.double()[None, :]
    if gate == "none":
        return dgam
    A = torch.exp(A_log.double())
    z = g.double() + dt_bias.double()[None, :]
    if gate == "lower_bound":
        s = torch.sigmoid(A * z)
        return dgam * lb * A * s * (1 - s)
    return -dgam * A * torch.sigmoid(z)


def main():
    from kdadbg.cases import get_case, make_inputs
    from kdadbg.diff import diff_dump
    from kdadbg.impls import resolve_impl
    from kdadbg.noise import floor_reference
    from kdadbg.reference import run_reference
    from kdadbg_kernels.taps import TapSelection
    from test_kernels_gpu import REAL_GPU

    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("cells", nargs="+", help="chunk:head")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="8192,8,128", help="T,H,K (V = K); the default is the GPU tests' size")
    a = ap.parse_args()
    from devices import use_device

    use_device("dg_probe.py", a.device,
                 cpu="--device cpu with a small --size, the kernels under the Triton interpreter")
    T, H, K = map(int, a.size.split(","))
    inputs, cfg = make_inputs(dataclasses.replace(get_case(a.case), T=T, H=H, K=K, V=K, **REAL_GPU[a.case]), seed=1)
    assert inputs.cu_seqlens is None and inputs.shape[0] == 1, "dense B = 1 cases only (token = 16 c + row)"
    C = cfg.chunk_size
    names = ("dgc", "dgT")
    ref = run_reference(inputs, cfg, taps=names, device=a.device)
    fl_out, fl_taps = floor_reference(inputs, cfg, "fp32", names, a.device)
    ours = resolve_impl("ours", "fp32", None).run(inputs, cfg, device=a.device, taps=TapSelection(names=names))
    dtb = inputs.dt_bias.reshape(H, -1) if inputs.dt_bias is not None else None
    for cell in a.cells:
        c, h = map(int, cell.split(":"))
        tok = slice(c * C, (c + 1) * C)
        g = inputs.g[0, tok, h]
        want = ref.outputs["dg"][0, tok, h]
        from_taps = lambda t: dg_from_taps(t["dgc"][c, h].cpu(), t["dgT"][c, h].cpu(), g.cpu(),
                                           inputs.A_log[h].cpu(), dtb[h].cpu(), cfg.lower_bound, cfg.gate)
        row = {"case": a.case, "chunk": c, "head": h,
               "kernel_dg": ratio(ours.outputs["dg"][0, tok, h].cpu(), want.cpu()),
               "floor_dg": ratio(fl_out["dg"][0, tok, h].cpu(), want.cpu()),
               "kernel_dg_from_its_taps_f64": ratio(from_taps(ours.taps), want.cpu()),
               "floor_dg_from_its_taps_f64": ratio(from_taps(fl_taps), want.cpu()),
               "reference_dg_from_its_taps_f64": ratio(from_taps(ref.taps), want.cpu()),
               "kernel_dgc": ratio(ours.taps["dgc"][c, h].cpu(), ref.taps["dgc"][c, h].cpu()),
               "floor_dgc": ratio(fl_taps["dgc"][c, h].cpu(), ref.taps["dgc"][c, h].cpu())}
        win = diff_dump(inputs, cfg, resolve_impl("ours", "fp32", None), device=a.device, chunks=(c - 1, c + 2),
                        heads=(h,), window=0, seeded=True)
        dg = win.cells["dg"]
        row["seeded_window_dg"] = [[int(x), float(dg.ratio[i, 0]), float(dg.floor[i, 0])]
                                   for i, x in enumerate(dg.chunks)]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
