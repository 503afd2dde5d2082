"""Chunked KDA on Triton: the forward as a list of stages (prepare → state pass → output pass)."""

from __future__ import annotations

import torch

from .common import PRECISIONS, FwdSaved, KernelChunks, TapPlan
from .prepare import kda_fwd_prepare
from .recurrence import kda_fwd_output, kda_fwd_recurrence
from .tlmath import GATE_IDS

CHUNK_SIZES = (16, 32, 64)
MAX_HEAD_DIM = 256
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _expect(ok: bool, name: str, expected: str, found) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}, found {found}")


def check_inputs(q, k, v, g, beta, *, chunk_size, gate, A_log, dt_bias, h0, cu_seqlens, precision):
    """Validate shapes, dtypes and options; returns ``(B, T, H, K, V, N)``."""
    _expect(q.dim() == 4, "q", "shape [B, T, H, K]", tuple(q.shape))
    B, T, H, K = q.shape
    _expect(v.dim() == 4 and tuple(v.shape[:3]) == (B, T, H), "v", f"shape [{B}, {T}, {H}, V]", tuple(v.shape))
    V = v.shape[-1]
    for name, t in (("k", k), ("g", g)):
        _expect(tuple(t.shape) == (B, T, H, K), name, f"shape {(B, T, H, K)}", tuple(t.shape))
    _expect(tuple(beta.shape) == (B, T, H), "beta", f"shape {(B, T, H)}", tuple(beta.shape))
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _expect(t.dtype in FLOAT_DTYPES, name, "float32, bfloat16 or float16", t.dtype)
        _expect(t.device == q.device, name, f"device {q.device}", t.device)
    _expect(1 <= K <= MAX_HEAD_DIM and 1 <= V <= MAX_HEAD_DIM, "head dims", f"K, V in [1, {MAX_HEAD_DIM}]",
            (K, V))
    _expect(chunk_size in CHUNK_SIZES, "chunk_size", f"one of {CHUNK_SIZES}", chunk_size)
    _expect(gate in GATE_IDS, "gate", f"one of {tuple(GATE_IDS)}", gate)
    _expect(precision in PRECISIONS, "precision", f"one of {PRECISIONS}", precision)
    if gate != "none":
        _expect(A_log is not None and A_log.numel() == H, "A_log", f"{H} values (gate {gate!r})",
                None if A_log is None else tuple(A_log.shape))
        _expect(dt_bias is not None and dt_bias.numel() == H * K, "dt_bias", f"[{H}, {K}] (gate {gate!r})",
                None if dt_bias is None else tuple(dt_bias.shape))
    if cu_seqlens is None:
        N = B
    else:
        _expect(B == 1, "q", "batch size 1 with cu_seqlens", B)
        cu = cu_seqlens.detach().cpu().long()
        ok = cu.dim() == 1 and cu.numel() >= 2 and int(cu[0]) == 0 and int(cu[-1]) == T and bool(
            (cu[1:] >= cu[:-1]).all())
        _expect(ok, "cu_seqlens", f"non-decreasing offsets from 0 to T={T}", cu.tolist())
        N = cu.numel() - 1
    if h0 is not None:
        _expect(tuple(h0.shape) == (N, H, K, V), "h0", f"shape {(N, H, K, V)} (math layout [N,H,K,V])",
                tuple(h0.shape))
    return B, T, H, K, V, N


def kda_forward(q, k, v, g, beta, *, scale, chunk_size=16, gate="none", lower_bound=-5.0, qk_l2norm=True,
                beta_sigmoid=True, A_log=None, dt_bias=None, h0=None, cu_seqlens=None, precision="fp32",
                tap_plan: TapPlan | None = None):
    """Chunked KDA forward.

    Args:
        q, k, g: ``[B, T, H, K]`` (g is the raw gate, or the natural-log decay when ``gate="none"``);
        v: ``[B, T, H, V]``; beta: ``[B, T, H]`` logits (``beta_sigmoid``) or b itself.
        A_log ``[H]``, dt_bias ``[H, K]``: gate parameters (``lower_bound`` and ``softplus`` gates).
        h0: ``[N, H, K, V]`` fp32 initial state in math layout, or None for zeros.
        cu_seqlens: ``[N + 1]`` varlen offsets (B == 1), or None (N = B).
        precision: ``"fp32"`` (exact fp32 matmuls) or ``"bf16"`` (bf16 operands, fp32 accumulation).
        tap_plan: where to write forward taps (see ``TapPlan``), or None.

    Returns:
        ``(o [B,T,H,V] fp32, ht [N,H,K,V] fp32, FwdSaved, KernelChunks)``.

    Example:
        >>> o, ht, saved, chunks = kda_forward(q, k, v, g, beta, scale=K ** -0.5, gate="lower_bound",
        ...                                    A_log=A_log, dt_bias=dt_bias, h0=h0)
    """
    B, T, H, K, V, N = check_inputs(q, k, v, g, beta, chunk_size=chunk_size, gate=gate, A_log=A_log,
                                    dt_bias=dt_bias, h0=h0, cu_seqlens=cu_seqlens, precision=precision)
    chunks = KernelChunks.build(B, T, cu_seqlens, chunk_size, q.device)
    q, k, g = (x.reshape(B * T, H, K).contiguous() for x in (q, k, g))
    v = v.reshape(B * T, H, V).contiguous()
    beta = beta.reshape(B * T, H).contiguous()
    if gate != "none":
        A_log = A_log.reshape(H).float().contiguous()
        dt_bias = dt_bias.reshape(H, K).float().contiguous()
    if h0 is not None:
        h0 = h0.float().contiguous()

    qn, kn, gc, b, w, u, gT, INV, Mqk = kda_fwd_prepare(
        q, k, v, g, beta, chunks, scale=scale, gate=gate, lower_bound=lower_bound, qk_l2norm=qk_l2norm,
        beta_sigmoid=beta_sigmoid, A_log=A_log, dt_bias=dt_bias, precision=precision, tap_plan=tap_plan)
    S, U, ht = kda_fwd_recurrence(kn, gc, gT, w, u, h0, chunks, precision=precision)
    o = kda_fwd_output(qn, kn, gc, v, b, Mqk, S, U, chunks, scale=scale, precision=precision,
                       tap_plan=tap_plan)
    saved = FwdSaved(qn=qn, kn=kn, gc=gc, gT=gT, b=b, INV=INV, Mqk=Mqk, S=S, U=U)
    return o.view(B, T, H, V), ht, saved, chunks
