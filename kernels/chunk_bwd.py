"""Chunked KDA backward: the stages in order.

1. ``chunk_bwd_prep``      (recurrence_bwd) qd, kr, w (those the forward did not keep) and dU0 = Mqk^T dO,
                                            parallel over chunks;
2. ``recurrence_bwd``      (recurrence_bwd) reverse state recurrence: dS⁺ per chunk, dU, dh0;
3. ``chunk_bwd_dqkg``      (prepare_bwd)    per-chunk gradients: dv, dqn, dkn, dg, db partials,
                                            dA_log / ddt_bias partials;
4. ``chunk_bwd_finish``    (prepare_bwd)    L2-norm backward, db, dbeta;
5. deterministic reductions of the parameter partials (torch.sum, no atomics).
"""

from __future__ import annotations

import torch

from .common import PRECISIONS, FwdSaved, KernelChunks, TapPlan, udu_bf16
from .prepare_bwd import chunk_bwd_dqkg, chunk_bwd_finish
from .recurrence_bwd import chunk_bwd_prep, recurrence_bwd


def _check(name, x, shape, float_only=True):
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"kda_backward: {name}: expected shape {tuple(shape)}, found {tuple(x.shape)}")
    if float_only and not x.is_floating_point():
        raise ValueError(f"kda_backward: {name}: expected a float tensor, found {x.dtype}")


def kda_backward(saved: FwdSaved, chunks: KernelChunks, q, k, v, g, beta, do, dht, *, scale: float, gate: str,
                 lower_bound: float, qk_l2norm: bool, beta_sigmoid: bool, A_log=None, dt_bias=None,
                 precision: str = "fp32", tap_plan: TapPlan | None = None, has_h0: bool = True,
                 grad_dtypes: bool = False) -> dict:
    """Gradients of chunked KDA: float32, or with ``grad_dtypes`` dq, dk, dv, dg, dbeta in the dtypes of
    q, k, v, g, beta (rounded to nearest in the kernels that write them; what the autograd op returns).

    q, k, g: [B,T,H,K]; v, do: [B,T,H,V]; beta: [B,T,H] (raw, any float dtype); dht: [N,H,K,V] math
    layout or None; A_log [H], dt_bias [H,K] (or [H*K]) for the ``lower_bound``/``softplus`` gates.
    Returns ``dq, dk, dg`` [B,T,H,K], ``dv`` [B,T,H,V], ``dbeta`` [B,T,H] (w.r.t. the raw g and beta),
    ``dh0`` [N,H,K,V] math layout when ``has_h0``, and ``dA_log`` [H], ``ddt_bias`` [H,K] for gates
    with parameters.

    Example::

        o, ht, saved, chunks = kda_forward(...)
        grads = kda_backward(saved, chunks, q, k, v, g, beta, do, None, scale=K ** -0.5,
                             gate="lower_bound", lower_bound=-5.0, qk_l2norm=True, beta_sigmoid=True,
                             A_log=A_log, dt_bias=dt_bias)
    """
    if precision not in PRECISIONS:
        raise ValueError(f"kda_backward: precision: expected one of {PRECISIONS}, found {precision!r}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    BT, N, NC, C = B * T, chunks.n_seqs, chunks.n_chunks, chunks.chunk_size
    for name, x, shape in (("k", k, (B, T, H, K)), ("g", g, (B, T, H, K)), ("v", v, (B, T, H, V)),
                           ("do", do, (B, T, H, V)), ("beta", beta, (B, T, H)),
                           ("saved.qn", saved.qn, (BT, H, K)), ("saved.kn", saved.kn, (BT, H, K)),
                           ("saved.gc", saved.gc, (BT, H, K)), ("saved.gT", saved.gT, (NC, H, K)),
                           ("saved.b", saved.b, (BT, H)), ("saved.INV", saved.INV, (NC, H, C, C)),
                           ("saved.Mqk", saved.Mqk, (NC, H, C, C)), ("saved.S", saved.S, (NC, H, K, V)),
                           ("saved.U", saved.U, (BT, H, V))):
        _check(name, x, shape)
    if (saved.rq is None) != (saved.rk is None):
        raise ValueError("kda_backward: saved.rq and saved.rk: expected both or neither, found one")
    for name, x in (("saved.rq", saved.rq), ("saved.rk", saved.rk)):
        if x is not None:
            _check(name, x, (BT, H))
    for name, x, shape in (("saved.qd", saved.qd, (BT, H, K)), ("saved.w", saved.w, (BT, H, K))):
        if x is not None:
            _check(name, x, shape)
    if dht is not None:
        _check("dht", dht, (N, H, K, V))
        dht = dht.float().contiguous()
    if gate != "none":
        if A_log is None or dt_bias is None:
            raise ValueError(f"kda_backward: gate {gate!r} needs A_log and dt_bias")
        A_log = A_log.float().contiguous()
        dt_bias = dt_bias.float().reshape(H, K).contiguous()

    def flat(x, *tail):
        return x.contiguous().view(BT, H, *tail)

    qf, kf, gf, vf, dof = flat(q, K), flat(k, K), flat(g, K), flat(v, V), flat(do, V)
    betaf = beta.contiguous().view(BT, H)
    # qn, kn may be q, k themselves (no l2norm): the kernels read any float dtype, so no fp32 copy
    # Mqk, U and S may be bf16 (prepare.mqk_bf16, common.udu_bf16, common.s_bf16): their readers take them as
    # they are in bf16 mode (a conversion to fp32 here took 0.415 ms at H32 T16384: docs/gpu/round55/call3)
    sv = {f: getattr(saved, f).contiguous() if f in ("qn", "kn") or (f in ("Mqk", "U", "S") and precision == "bf16")
          else getattr(saved, f).float().contiguous() for f in ("qn", "kn", "gc", "gT", "b", "INV", "Mqk", "S", "U")}
    rs = {f: None if getattr(saved, f) is None else getattr(saved, f).float().contiguous() for f in ("rq", "rk")}

    # the forward's qd (and w) where it kept them (chunk.bwd_fwd_operands)
    fwd_ops = {f: getattr(saved, f).contiguous() for f in ("qd", "w") if getattr(saved, f) is not None}
    qd, kr, w, dU = chunk_bwd_prep(sv["qn"], sv["kn"], sv["gc"], sv["gT"], sv["b"], sv["INV"], sv["Mqk"], dof,
                                   chunks, scale=scale, precision=precision, tap_plan=tap_plan, **rs,
                                   **fwd_ops)
    # the completed dU in bf16 (common.udu_bf16), beside dU0's fp32: the V pass's MMAs read it so anyway
    dU_out = torch.empty_like(dU, dtype=torch.bfloat16) if udu_bf16(precision) else None
    dSn, dh0 = recurrence_bwd(qd, kr, w, dof, dU, sv["gT"], dht, chunks, has_h0=has_h0, precision=precision,
                              tap_plan=tap_plan, dU_out=dU_out)
    dU = dU if dU_out is None else dU_out
    f32 = torch.float32
    dtypes = {n: (x.dtype if grad_dtypes else f32) for n, x in (("dq", q), ("dk", k), ("dv", v), ("dg", g),
                                                                ("dbeta", beta))}
    # with l2norm the per-chunk kernel's dqn, dkn stay fp32: the finish kernel reads them
    dqn_dtypes = (f32, f32) if qk_l2norm else (dtypes["dq"], dtypes["dk"])
    dqn, dkn, dv, dg, db_part, dA_part, ddt_part = chunk_bwd_dqkg(
        sv["qn"], sv["kn"], sv["gc"], sv["gT"], sv["b"], sv["INV"], sv["S"], dSn, sv["U"], dU, vf, dof, gf,
        A_log, dt_bias, chunks, scale=scale, gate=gate, lower_bound=lower_bound, precision=precision,
        tap_plan=tap_plan, out_dtypes=(*dqn_dtypes, dtypes["dv"], dtypes["dg"]), **rs)
    dq, dk, dbeta = chunk_bwd_finish(qf, kf, dqn, dkn, betaf, db_part, chunks, qk_l2norm=qk_l2norm,
                                     beta_sigmoid=beta_sigmoid, precision=precision, tap_plan=tap_plan,
                                     out_dtypes=(dtypes["dq"], dtypes["dk"], dtypes["dbeta"]))

    out = {"dq": dq.view(B, T, H, K), "dk": dk.view(B, T, H, K), "dv": dv.view(B, T, H, V),
           "dg": dg.view(B, T, H, K), "dbeta": dbeta.view(B, T, H)}
    if has_h0:
        out["dh0"] = dh0
    if gate != "none":
        out["dA_log"] = dA_part.sum(dim=(0, 2))
        out["ddt_bias"] = ddt_part.sum(dim=0)
    return out
