"""Time each stage of our forward and backward separately (``triton.testing.do_bench`` medians).

    python benchmarks/stage_bench.py [--H 16] [--T 16384] [--D 128] [--chunk-size 64] [--varlen] [--tag NAME]
                                     [--json-lines FILE] [--dqkg-gates lower_bound,softplus]

Inputs as ``benchmarks/bench.py`` (bf16 q/k/v, fp32 log-decay, no in-kernel gate/l2norm/sigmoid),
bf16 mode. One line per run: the stage times in ms and the ``KDADBG_*`` overrides in effect
(``kernels/tuning.py``), so one GPU call can time many launch variants:

    for v in "" KDADBG_REC_BV=64 KDADBG_PREP_WARPS=8; do env $v python benchmarks/stage_bench.py --tag "$v"; done
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--varlen", action="store_true", help="bench.py's six mixed-length sequences (T = 16384)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--json-lines", default=None, help="append the result as one JSON line to this file")
    ap.add_argument("--dqkg-gates", default="", help="also time the backward K and V passes with these gates' "
                    "derivatives (comma-separated: lower_bound, softplus) on the same inputs, the raw gate in bf16 "
                    "and dg written in bf16 as in those settings: what the gate's part of the K pass costs")
    a = ap.parse_args(argv)
    from devices import use_device

    use_device("stage_bench.py")
    import torch
    import triton.testing
    from bench import MIXED6
    from peer_inputs import peer_inputs

    from kdadbg_kernels.common import KernelChunks, udu_bf16
    from kdadbg_kernels.prepare import kda_fwd_prepare
    from kdadbg_kernels.prepare_bwd import chunk_bwd_dqkg, chunk_bwd_finish
    from kdadbg_kernels.recurrence import fuse_out, kda_fwd_output, kda_fwd_recurrence
    from kdadbg_kernels.recurrence_bwd import chunk_bwd_prep, recurrence_bwd

    dev = torch.device("cuda")
    T, H, D, C = (sum(MIXED6) if a.varlen else a.T), a.H, a.D, a.chunk_size
    x, cu, do = peer_inputs(T, H, D, dev, lens=MIXED6 if a.varlen else None, requires_grad=False)
    q, k, v, g, beta = (x[n][0] for n in ("q", "k", "v", "g", "beta"))  # flattened B*T = T
    do = do[0]
    chunks = KernelChunks.build(1, T, cu.cpu() if cu is not None else None, C, dev)
    scale, p = D ** -0.5, "bf16"
    opts = dict(scale=scale, gate="none", lower_bound=-5.0, qk_l2norm=False, beta_sigmoid=False, A_log=None,
                dt_bias=None, precision=p)

    stages = {}
    t0 = time.perf_counter()

    fused = fuse_out(p)

    def prep():
        return kda_fwd_prepare(q, k, v, g, beta, chunks, store_qd=fused, **opts)

    qn, kn, gc, krT, b, w, u, gT, INV, Mqk, qd_o, _, _ = prep()  # pre-gated: no row scales
    stages["fwd_prepare"] = prep

    # outputs and gradients in the inputs' dtypes, as the autograd op stores them
    def rec():
        return kda_fwd_recurrence(krT, gT, w, u, None, chunks, precision=p, qd=qd_o, Mqk=Mqk, out_dtype=v.dtype)

    S, U, ht, _ = rec()
    stages["fwd_recurrence"] = rec  # with o when fused: then there is no fwd_output stage (no taps here)
    if not fused:
        stages["fwd_output"] = lambda: kda_fwd_output(qn, kn, gc, v, b, Mqk, S, U, chunks, scale=scale,
                                                      precision=p, out_dtype=v.dtype)

    def bprep():
        return chunk_bwd_prep(qn, kn, gc, gT, b, INV, Mqk, do, chunks, scale=scale, precision=p)

    qd, krb, wb, dU0 = bprep()
    stages["bwd_prep"] = bprep
    # the completed dU as the op stores it: bf16 in bf16 mode (common.udu_bf16), else dU0's buffer in place
    dU = torch.empty_like(dU0, dtype=torch.bfloat16) if udu_bf16(p) else dU0

    def brec():
        return recurrence_bwd(qd, krb, wb, do, dU0, gT, None, chunks, has_h0=False, precision=p,
                              dU_out=None if dU is dU0 else dU)

    dSn, _ = brec()
    stages["bwd_recurrence"] = brec

    def dqkg():
        return chunk_bwd_dqkg(qn, kn, gc, gT, b, INV, S, dSn, U, dU, v, do, g, None, None, chunks, scale=scale,
                              gate="none", lower_bound=-5.0, precision=p,
                              out_dtypes=(q.dtype, k.dtype, v.dtype, g.dtype))

    dq, dk, dv, dg, db_part, _, _ = dqkg()
    stages["bwd_dqkg"] = dqkg
    g16 = g.to(torch.bfloat16)
    A_log, dt_bias = torch.zeros(H, device=dev), torch.zeros(H, D, device=dev)
    for gate in filter(None, a.dqkg_gates.split(",")):
        def dqkg_gated(gate=gate):
            return chunk_bwd_dqkg(qn, kn, gc, gT, b, INV, S, dSn, U, dU, v, do, g16, A_log, dt_bias, chunks,
                                  scale=scale, gate=gate, lower_bound=-5.0, precision=p,
                                  out_dtypes=(q.dtype, k.dtype, v.dtype, g16.dtype))
        dqkg_gated()
        stages[f"bwd_dqkg[{gate}]"] = dqkg_gated
    stages["bwd_finish"] = lambda: chunk_bwd_finish(q, k, dq, dk, beta, db_part, chunks, qk_l2norm=False,
                                                    beta_sigmoid=False, precision=p,
                                                    out_dtypes=(q.dtype, k.dtype, beta.dtype))
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    res = {name: float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))
           for name, fn in stages.items()}
    res["total"] = sum(v for k, v in res.items() if "[" not in k)
    knobs = {k: v for k, v in os.environ.items() if k.startswith("KDADBG_")}
    line = {"tag": a.tag, "H": H, "T": T, "D": D, "C": C, "varlen": a.varlen, "knobs": knobs,
            "first_call_s": round(compile_s, 2),
            "ms": {k: round(v, 4) for k, v in res.items()}}
    print(f"{a.tag or 'default':<28} " + " ".join(f"{k}={v:.3f}" for k, v in res.items()), flush=True)
    if a.json_lines:
        with open(a.json_lines, "a") as f:
            f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
