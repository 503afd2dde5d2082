"""The chunked float64 reference: the judge every kernel is diffed against.

It follows spec §3–§6 stage by stage, and each stage has a function of the same name:

1. ``activate``        l2norm, gate activation and beta sigmoid on the token axis;
2. ``fwd_prepare``     per chunk, all chunks at once: gc, gT, b, qd, kd, ki, kr, L, INV, Mqk;
3. ``fwd_recurrence``  sequential over chunk positions, vectorised over sequences and heads:
                       S, vcorr, U, o, ht;
4. ``bwd_recurrence``  the same walk in reverse: dS, dU, dkr, dMqk, dvcorr, dL, dqd, dkd, dki,
                       db, dgT;
5. ``bwd_prepare``     per chunk again: dgc, the collapsed dqn/dkn, the reverse gate cumsum;
                       the activations' chain rule (l2norm, gate, sigmoid) is autograd's.

Every ``exp`` of a within-chunk gate difference goes through :func:`pair_decay`, which masks to
``i >= j`` before the exponential, so no masked entry can overflow (gates masked to -1000 stay
finite). Taps are returned chunk-major ``[n_chunks, H, *shape]`` with padding rows (and, for
``[C, C]`` taps, columns) set to 0.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from kdadbg_kernels.taps import TAP_NAMES, TapSelection

from .chunks import ChunkTable, chunk_table
from .config import KDAConfig, KDAInputs
from .errors import KdadbgError
from .tapsfile import zero_padding

Progress = Callable[[str, int, int], None]

# Pairwise [chunks, H, C, C, K] work is done this many chunks at a time to bound memory.
_PAIR_BLOCK_ELEMS = 1 << 25

# Rounding of matrix-product operands (run_reference's ``dot_dtype``); None: exact in ``dtype``.
_DOT_DTYPE: ContextVar[torch.dtype | None] = ContextVar("kdadbg_reference_dot_dtype", default=None)


def _round(x: torch.Tensor) -> torch.Tensor:
    d = _DOT_DTYPE.get()
    return x if d is None else x.to(d).to(x.dtype)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` with both operands rounded to the active ``dot_dtype`` (accumulation stays in their dtype)."""
    if _DOT_DTYPE.get() is None:
        return a @ b
    return _round(a) @ _round(b)


@dataclass
class ReferenceResult:
    outputs: dict[str, torch.Tensor]  # o, ht, dq, dk, dv, dg, dbeta, dh0?, dA_log?, ddt_bias?
    taps: dict[str, torch.Tensor]     # name -> [n_chunks, HV, *per-chunk shape], padding 0
    chunks: ChunkTable


def activate(inputs: KDAInputs, cfg: KDAConfig, dtype, device) -> tuple[dict, dict]:
    """Leaves (raw inputs needing gradients) and token-axis activations ``[B*T, HV, ...]``, one per
    value head: with GVA, q and k (after l2norm) are indexed by the group map ``hv // group``, so
    autograd sums their gradients over each group."""
    B, T, H, K, V = inputs.shape
    HV, G = inputs.HV, inputs.group
    leaves = {}
    for name in ("q", "k", "g", "beta", "A_log", "dt_bias"):
        t = getattr(inputs, name)
        if t is not None:
            leaves[name] = t.detach().to(device=device, dtype=dtype).requires_grad_(True)
    q = leaves["q"].reshape(B * T, H, K)
    k = leaves["k"].reshape(B * T, H, K)
    g = leaves["g"].reshape(B * T, HV, K)
    beta = leaves["beta"].reshape(B * T, HV)
    if cfg.qk_l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if G > 1:
        group_map = torch.arange(HV, device=q.device) // G
        q, k = q.index_select(1, group_map), k.index_select(1, group_map)
    if cfg.gate == "none":
        gam = g
    else:
        a = torch.exp(leaves["A_log"])[:, None]
        x = g + leaves["dt_bias"]
        gam = cfg.lower_bound * _sigmoid(a * x) if cfg.gate == "lower_bound" else -a * F.softplus(x)
    b = _sigmoid(beta) if cfg.beta_sigmoid else beta
    return leaves, {"qn": q, "kn": k, "gam": gam, "b": b}


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    """σ(x) as ``exp(logsigmoid(x))``: the same values, and autograd's derivative is σ(x) σ(-x), formed from
    ``exp(-|x|)``, where ``torch.sigmoid``'s is σ (1 - σ), which is 0 once σ rounds to 1 (x > 17 in float32).
    The float32 run of the reference is the noise floor (``kdadbg.noise``): with a saturated gate or beta its
    gradients would be 0, the floor ratio 1, and any gate gradient, a negated one too, would pass as the
    precision's limit, while float32 holds σ(-x) (e^-30 = 9e-14) well."""
    return torch.exp(F.logsigmoid(x))


def _to_chunks(x: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Token-axis ``[BT, H, *d]`` -> chunk-major ``[NC, H, C, *d]`` with padding rows 0."""
    y = x[idx]  # [NC, C, H, *d]
    m = valid.reshape(*valid.shape, *([1] * (y.dim() - 2)))
    y = torch.where(m, y, torch.zeros((), dtype=y.dtype, device=y.device))
    return y.movedim(1, 2)


def _to_tokens(y: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Inverse of :func:`_to_chunks`: valid rows of ``[NC, H, C, *d]`` back to ``[BT, H, *d]``."""
    y = y.movedim(2, 1)[valid]  # [n_valid_rows, H, *d]
    out = torch.zeros((n_tokens, *y.shape[1:]), dtype=y.dtype, device=y.device)
    out[idx[valid]] = y
    return out


def pair_decay(gc: torch.Tensor, diag: bool = True) -> torch.Tensor:
    """``P[..., i, j, k] = exp(gc[i, k] - gc[j, k])`` for ``i >= j`` (``i > j`` if not ``diag``), else 0.

    The mask is applied to the exponent, before ``exp``: masked entries never overflow.
    """
    C = gc.shape[-2]
    tri = torch.ones(C, C, dtype=torch.bool, device=gc.device)
    tri = torch.tril(tri) if diag else torch.tril(tri, -1)
    m = tri[..., None]
    d = gc[..., :, None, :] - gc[..., None, :, :]
    zero = torch.zeros((), dtype=gc.dtype, device=gc.device)
    return torch.where(m, torch.exp(torch.where(m, d, zero)), zero)


class Decay:
    """Products with the within-chunk decay ``P[i,j,k] = exp(gc[i,k] - gc[j,k])``, ``i >= j``.

    Three contractions cover every use (``X, Y`` are ``[..., C, K]``, ``M`` is ``[..., C, C]``):

    * ``scores(X, Y)[i,j] = sum_k X[i,k] Y[j,k] P[i,j,k]``    (kd ki^T, qd ki^T; lower part)
    * ``left(M, Y)[i,k]   = sum_j M[i,j] Y[j,k] P[i,j,k]``    (E * (M ki))
    * ``right(M, X)[j,k]  = sum_i M[i,j] X[i,k] P[i,j,k]``    (E^-1 * (M^T qd))

    Fast path: matrix products in 16-row blocks with the exponent anchored at the first row
    ``a_I`` of the later block ``I``: ``exp(gc_i - a_I) <= 1`` and, for an earlier block ``J``,
    ``exp(a_I - gc_j) <= 1``; only the diagonal block has growing factors, bounded by 16 tokens
    of decay. If those could overflow the dtype (gates masked to -1000, say), the exact masked
    pairwise form :func:`pair_decay` is used instead. Upper-triangle results are not meaningful:
    callers mask them.
    """

    BLOCK = 16

    def __init__(self, gc: torch.Tensor):
        *lead, C, K = gc.shape
        self.C, self.nb = C, C // self.BLOCK
        self.gc = gc
        gb = self._blocks(gc)
        a = gb[..., :1, :]                                               # anchors [.., I, 1, K]
        ij = torch.tril(torch.ones(self.nb, self.nb, dtype=torch.bool, device=gc.device))[:, :, None, None]
        expo = torch.where(ij, a.unsqueeze(-3) - gb.unsqueeze(-4), torch.zeros((), dtype=gc.dtype,
                                                                               device=gc.device))
        limit = 0.9 * math.log(torch.finfo(gc.dtype).max)
        self.pairwise = bool((expo > limit).any())
        if not self.pairwise:
            self.left_f = torch.exp(gb - a)                              # [.., I, 16, K]     <= 1
            self.right_f = torch.where(ij, torch.exp(expo), torch.zeros((), dtype=gc.dtype,
                                                                        device=gc.device))  # [.., I, J, 16, K]

    def _blocks(self, X):
        return X.reshape(*X.shape[:-2], self.nb, self.BLOCK, X.shape[-1])

    def _mblocks(self, M):
        B = self.BLOCK
        return M.reshape(*M.shape[:-2], self.nb, B, self.nb, B).transpose(-3, -2)   # [.., I, J, 16, 16]

    def _exact(self, spec, A, Bm):
        """The masked pairwise einsum, over slices of chunks to bound memory."""
        per = max(1, A[:1].numel() * self.C)
        step = max(1, _PAIR_BLOCK_ELEMS // per)
        return torch.cat([torch.einsum(spec, _round(A[s]), _round(Bm[s]), pair_decay(self.gc[s]))
                          for s in (slice(lo, lo + step) for lo in range(0, A.shape[0], step))])

    def scores(self, X, Y):
        if self.pairwise:
            return self._exact("nhik,nhjk,nhijk->nhij", X, Y)
        Xl = (self._blocks(X) * self.left_f).unsqueeze(-3)               # [.., I, 1, 16, K]
        Yr = self._blocks(Y).unsqueeze(-4) * self.right_f                # [.., I, J, 16, K]
        out = mm(Xl, Yr.transpose(-1, -2))                               # [.., I, J, 16, 16]
        return out.transpose(-3, -2).reshape(*X.shape[:-2], self.C, self.C)

    def left(self, M, Y):
        if self.pairwise:
            return self._exact("nhij,nhjk,nhijk->nhik", M, Y)
        Yr = self._blocks(Y).unsqueeze(-4) * self.right_f                # [.., I, J, 16, K]
        out = mm(self._mblocks(M), Yr).sum(-3) * self.left_f             # [.., I, 16, K]
        return out.reshape(Y.shape)

    def right(self, M, X):
        if self.pairwise:
            return self._exact("nhij,nhik,nhijk->nhjk", M, X)
        Xl = (self._blocks(X) * self.left_f).unsqueeze(-3)               # [.., I, 1, 16, K]
        out = mm(self._mblocks(M).transpose(-1, -2), Xl) * self.right_f  # [.., I, J, 16, K]
        return out.sum(-4).reshape(X.shape)


def fwd_prepare(x: dict, scale: float) -> dict:
    """Per-chunk quantities of spec §4.1 for all chunks at once (inputs chunk-major, padding 0)."""
    qn, kn, gam, b = x["qn"], x["kn"], x["gam"], x["b"]
    NC, H, C, K = kn.shape
    gc = torch.cumsum(gam, dim=2)
    gT = gc[:, :, -1, :]
    E = torch.exp(gc)
    qd, kd = scale * qn * E, kn * E
    ki = kn * torch.exp(-gc)
    kr = kn * torch.exp(gT[:, :, None, :] - gc)

    decay = Decay(gc)
    Fm = decay.scores(kn, kn).tril(-1)
    Mqk = (scale * decay.scores(qn, kn)).tril()
    L = b[..., :, None] * Fm
    eye = torch.eye(C, dtype=kn.dtype, device=kn.device).expand(NC, H, C, C)
    INV = torch.linalg.solve_triangular(eye + L, eye, upper=False, unitriangular=True)
    return dict(gc=gc, gT=gT, b=b, qd=qd, kd=kd, ki=ki, kr=kr, F=Fm, L=L, INV=INV, Mqk=Mqk, decay=decay)


def _positions(ct: ChunkTable, reverse: bool, until: int | None = None) -> range:
    """Chunk positions in walk order: all of them, or (``until``) the forward's ``t < until`` and
    the backward's ``t >= until``."""
    n = ct.max_chunks
    if reverse:
        return range(n - 1, (until or 0) - 1, -1)
    return range(n if until is None else min(n, until))


def _walk(ct: ChunkTable, reverse: bool, dev, until: int | None = None):
    """Chunk positions in walk order (:func:`_positions`), each with (active sequences, their global
    chunk ids).

    On the CPU the walk runs on one thread: its per-step products are small, and intra-op
    threading there costs more than it saves (4x slower on two busy cores).
    """
    n_per = ct.seq_chunk_base[1:] - ct.seq_chunk_base[:-1]
    threads = torch.get_num_threads()
    if torch.device(dev).type == "cpu":
        torch.set_num_threads(1)
    try:
        for t in _positions(ct, reverse, until):
            seqs = torch.nonzero(n_per > t).flatten()
            yield seqs.to(dev), (ct.seq_chunk_base[seqs] + t).to(dev)
    finally:
        torch.set_num_threads(threads)


def fwd_recurrence(p: dict, v: torch.Tensor, S0: torch.Tensor, ct: ChunkTable, dev,
                   progress: Progress | None = None, states_only: bool = False, until: int | None = None,
                   label: str = "reference forward") -> dict:
    """Spec §5.1, chunk by chunk: S (entering), vcorr, W, U and o per chunk; final states.

    ``states_only``: S and U alone (what the backward's states need), NaN in chunks not walked;
    ``until``: walk chunk positions ``t < until`` only (``ht``: the state entering position ``until``)."""
    S = S0.clone()
    if states_only:
        out = {n: torch.full((ct.n_chunks, *t.shape[1:]), float("nan"), dtype=v.dtype, device=v.device)
               for n, t in (("U", v), ("S", S0))}
    else:
        out = {n: torch.empty_like(v) for n in ("W", "vcorr", "U", "o")}
        out["S"] = torch.empty((ct.n_chunks, *S0.shape[1:]), dtype=v.dtype, device=v.device)
    total = len(_positions(ct, False, until))
    for step, (seqs, cs) in enumerate(_walk(ct, reverse=False, dev=dev, until=until)):
        s = S[seqs]
        kd, kr = p["kd"][cs], p["kr"][cs]
        W = v[cs] - mm(kd, s)
        vcorr = p["b"][cs][..., None] * W
        U = mm(p["INV"][cs], vcorr)
        out["S"][cs], out["U"][cs] = s, U
        if not states_only:
            out["W"][cs], out["vcorr"][cs] = W, vcorr
            out["o"][cs] = mm(p["qd"][cs], s) + mm(p["Mqk"][cs], U)
        S[seqs] = torch.exp(p["gT"][cs])[..., None] * s + mm(kr.transpose(-1, -2), U)
        if progress:
            progress(label, step + 1, total)
    out["ht"] = S
    return out


def bwd_recurrence(p: dict, f: dict, do: torch.Tensor, dhT: torch.Tensor, ct: ChunkTable, dev,
                   progress: Progress | None = None, states_only: bool = False, until: int = 0,
                   label: str = "reference backward") -> dict:
    """Spec §6.1 in reverse chunk order. ``dS`` of a chunk is the gradient w.r.t. the state
    entering it; the gradient arriving from the next chunk is read before it is overwritten.

    ``states_only``: dS alone (from dU, dvcorr, dv: the same operations), NaN in chunks not walked;
    ``until``: walk chunk positions ``t >= until`` only."""
    dSp = dhT.clone()
    names = ("dS",) if states_only else ("dU", "dkr", "dMqk", "dvcorr", "dL", "dv", "db", "dgT", "dqd_inter",
                                          "dkd_inter", "dS")
    out = {}
    total = len(_positions(ct, True, until))
    for step, (seqs, cs) in enumerate(_walk(ct, reverse=True, dev=dev, until=until)):
        ds = dSp[seqs]                      # dS[c+1]: from the next chunk, or dht
        U, dO = f["U"][cs], do[cs]
        Mqk, INV, kr, kd, qd, b = (p[n][cs] for n in ("Mqk", "INV", "kr", "kd", "qd", "b"))
        eT = torch.exp(p["gT"][cs])
        dU = mm(Mqk.transpose(-1, -2), dO) + mm(kr, ds)
        dvcorr = mm(INV.transpose(-1, -2), dU)
        dv = b[..., None] * dvcorr
        dS = eT[..., None] * ds + mm(qd.transpose(-1, -2), dO) - mm(kd.transpose(-1, -2), dv)
        vals = dict(dU=dU, dvcorr=dvcorr, dv=dv, dS=dS)
        if not states_only:
            S, W = f["S"][cs], f["W"][cs]
            dkr = mm(U, ds.transpose(-1, -2))
            dL = -torch.tril(mm(dvcorr, U.transpose(-1, -2)), -1)
            vals.update(dkr=dkr, dMqk=torch.tril(mm(dO, U.transpose(-1, -2))), dL=dL,
                        db=(dvcorr * W).sum(-1) + (dL * p["F"][cs]).sum(-1),
                        dgT=eT * (ds * S).sum(-1) + (dkr * kr).sum(-2),
                        dqd_inter=mm(dO, S.transpose(-1, -2)), dkd_inter=-mm(dv, S.transpose(-1, -2)))
        for n in names:
            if n not in out:
                shape = (ct.n_chunks, *vals[n].shape[1:])
                out[n] = (torch.full(shape, float("nan"), dtype=dS.dtype, device=dS.device) if states_only
                          else torch.empty(shape, dtype=dS.dtype, device=dS.device))
            out[n][cs] = vals[n]
        dSp[seqs] = dS
        if progress:
            progress(label, step + 1, total)
    out["dh0"] = dSp
    return out


def bwd_prepare(x: dict, p: dict, r: dict, scale: float) -> dict:
    """Spec §6.3–§6.4 on chunks: the definitional dqd/dkd/dki taps, and the collapsed gradients
    w.r.t. qn, kn and the per-token gate (``dgam``), formed with masked pairwise decays so that
    no ``exp(-gc)`` of a whole chunk is ever needed."""
    qn, kn, gc = x["qn"], x["kn"], p["gc"]
    NC, H, C, K = kn.shape
    dMqk, dF = r["dMqk"], p["b"][..., :, None] * r["dL"]
    E = torch.exp(gc)

    decay = p["decay"]
    q_intra = decay.left(dMqk, kn)                                   # E * (dMqk ki)
    k_intra = decay.left(dF, kn)                                     # E * (dF ki)
    Ei_dki = decay.right(dMqk, scale * qn) + decay.right(dF, kn)     # E^-1 * dki
    E_dqd = E * r["dqd_inter"] + q_intra
    E_dkd = E * r["dkd_inter"] + k_intra
    R_dkr = torch.exp(p["gT"][:, :, None, :] - gc) * r["dkr"]
    dqn = scale * E_dqd
    dkn = E_dkd + Ei_dki + R_dkr
    dgc = qn * dqn + kn * (E_dkd - Ei_dki - R_dkr)
    dgam = torch.flip(torch.cumsum(torch.flip(dgc, [2]), 2), [2]) + r["dgT"][:, :, None, :]
    return dict(
        dqd=r["dqd_inter"] + mm(dMqk, p["ki"]),
        dkd=r["dkd_inter"] + mm(dF, p["ki"]),
        dki=mm(dMqk.transpose(-1, -2), p["qd"]) + mm(dF.transpose(-1, -2), p["kd"]),
        dgc=dgc, dqn=dqn, dkn=dkn, dgam=dgam,
    )


def _state_in(t: torch.Tensor | None, layout: str, shape, dtype, device) -> torch.Tensor:
    if t is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    t = t.to(device=device, dtype=dtype)
    return t.transpose(-1, -2).contiguous() if layout == "vk" else t.contiguous()


def _state_out(S: torch.Tensor, layout: str) -> torch.Tensor:
    return S.transpose(-1, -2).contiguous() if layout == "vk" else S.contiguous()


# Peak memory of a run: ``_PER_TAPS`` times the size of all taps plus ``_PER_TOKEN_TENSORS`` times one
# [tokens, heads, max(K, V)] tensor, in ``dtype``. Fitted to the growth of the process's peak RSS over a float64
# run (every tap) on this project's CPU machine, fla_layer gates, K = V = 128: 4.21 GiB at H 8, T 8192,
# chunk 64; 4.56 at chunk 16; 2.25 at H 4, T 8192, chunk 64; 2.17 at H 8, T 4096, chunk 32 (the fit 0.55, 56;
# rounded up, it gives 4.52, 4.90, 2.26, 2.31). The token-sized tensors (inputs, activations, gradients and
# their autograd graph in float64) dominate; a single factor over the taps (2.5) had been fitted at chunk 16
# and missed chunk 64 by 1.5x.
_PER_TAPS = 0.6
_PER_TOKEN_TENSORS = 60


def _check_memory(n_chunks, H, C, K, V, dtype, device) -> None:
    """Refuse up front a run that cannot fit (every intermediate is computed, whatever is tapped)."""
    from .memory import free_bytes

    need = (_PER_TAPS * TapSelection().nbytes(n_chunks, H, C, K, V, itemsize=dtype.itemsize)
            + _PER_TOKEN_TENSORS * n_chunks * C * H * max(K, V) * dtype.itemsize)
    free = free_bytes(str(torch.device(device).type))
    if need > free:
        raise KdadbgError(f"reference: about {need / 2**30:.1f} GiB needed for {n_chunks} chunks x {H} heads "
                          f"(K={K}, V={V}, chunk {C}), {free / 2**30:.1f} GiB free on {device}; "
                          + ("free GPU memory (another process holds it?), use --device cpu, "
                             if torch.device(device).type == "cuda" else "use --device cuda, ")
                          + "a window (run/diff --chunks A:B: the reference then walks only the states it "
                            "needs and runs on the window alone), or a shorter dump (fewer tokens or heads; "
                            "--heads and --taps do not shrink it: the reference computes every head and tap)")


def run_reference(inputs: KDAInputs, config: KDAConfig, taps: Iterable[str] | None = TAP_NAMES,
                  device="cpu", dtype=torch.float64, progress: Progress | None = None,
                  dot_dtype: torch.dtype | None = None) -> ReferenceResult:
    """Forward and backward of chunked KDA in ``dtype`` (float64: the judge).

    Args:
        inputs: the dump's tensors (any float dtype; upcast exactly).
        config: scale, chunk size, gate mode, flags, state layout.
        taps: registry names to return (all by default; ``None`` or ``()`` for none).
        device: ``"cpu"`` or ``"cuda"``.
        dot_dtype: round the operands of every matrix product to this dtype (e.g. ``torch.bfloat16``),
            accumulating in ``dtype``: a model of low-precision kernels for noise floors. None: exact.
    Returns:
        outputs in the dump's shapes (``ht``/``dh0`` in its state layout), taps chunk-major
        ``[n_chunks, HV, *]`` over the value heads (GVA: ``dq``/``dk`` per q/k head, summed over groups).

    Example:
        >>> res = run_reference(*make_inputs(get_case("basic")))
        >>> res.outputs["dq"].shape, res.taps["S"].shape
    """
    token = _DOT_DTYPE.set(dot_dtype)
    try:
        return _run_reference(inputs, config, tuple(taps or ()), device, dtype, progress)
    finally:
        _DOT_DTYPE.reset(token)


def _run_reference(inputs: KDAInputs, config: KDAConfig, taps: tuple[str, ...], device, dtype,
                   progress: Progress | None) -> ReferenceResult:
    B, T, _, K, V = inputs.shape
    H = inputs.HV   # the recurrence, its taps and every output but dq, dk are per value head
    N, C = inputs.n_seqs, config.chunk_size
    ct = chunk_table(B, T, inputs.cu_seqlens, C)
    _check_memory(ct.n_chunks, H, C, K, V, dtype, device)
    idx, valid = (x.to(device) for x in ct.token_index())

    leaves, act = activate(inputs, config, dtype, device)
    v = inputs.v.to(device=device, dtype=dtype).reshape(B * T, H, V)
    do = inputs.do.to(device=device, dtype=dtype).reshape(B * T, H, V)
    with torch.no_grad():
        x = {n: _to_chunks(t.detach(), idx, valid) for n, t in act.items()}
        vc, doc = _to_chunks(v, idx, valid), _to_chunks(do, idx, valid)
        p = fwd_prepare(x, config.scale)
        S0 = _state_in(inputs.h0, config.state_layout, (N, H, K, V), dtype, device)
        dhT = _state_in(inputs.dht, config.state_layout, (N, H, K, V), dtype, device)
        f = fwd_recurrence(p, vc, S0, ct, device, progress)
        r = bwd_recurrence(p, f, doc, dhT, ct, device, progress)
        bp = bwd_prepare(x, p, r, config.scale)
        grads_tok = {
            "qn": _to_tokens(bp["dqn"], idx, valid, B * T),
            "kn": _to_tokens(bp["dkn"], idx, valid, B * T),
            "gam": _to_tokens(bp["dgam"], idx, valid, B * T),
            "b": _to_tokens(r["db"], idx, valid, B * T),
        }
    names = [n for n in ("q", "k", "g", "beta", "A_log", "dt_bias") if n in leaves]
    if config.gate == "none":
        names = [n for n in names if n not in ("A_log", "dt_bias")]
    grads = torch.autograd.grad([act[n] for n in grads_tok], [leaves[n] for n in names],
                                [grads_tok[n] for n in grads_tok], allow_unused=True)
    grads = {n: (gr if gr is not None else torch.zeros_like(leaves[n])) for n, gr in zip(names, grads)}

    outputs = {
        "o": _to_tokens(f["o"], idx, valid, B * T).reshape(B, T, H, V),
        "ht": _state_out(f["ht"], config.state_layout),
        "dq": grads["q"], "dk": grads["k"],
        "dv": _to_tokens(r["dv"], idx, valid, B * T).reshape(B, T, H, V),
        "dg": grads["g"], "dbeta": grads["beta"],
    }
    if inputs.h0 is not None:
        outputs["dh0"] = _state_out(r["dh0"], config.state_layout)
    if config.gate != "none":
        outputs["dA_log"], outputs["ddt_bias"] = grads["A_log"], grads["dt_bias"]
    outputs = {n: t.detach() for n, t in outputs.items()}

    pool = {**p, **f, **r, **bp}
    del pool["decay"]
    tap_out = {n: zero_padding(n, pool[n], ct.length.to(device)) for n in taps}
    return ReferenceResult(outputs, tap_out, ct)


def run_states(inputs: KDAInputs, config: KDAConfig, *, fwd_until: int | None = None, bwd_until: int | None = None,
               device="cpu", dtype=torch.float64, progress: Progress | None = None,
               label: str = "reference seeds") -> dict[str, torch.Tensor]:
    """The reference's states alone, the seeds of a window (:mod:`kdadbg.window`): ``S`` entering each
    chunk over the forward walk of chunk positions ``t < fwd_until`` (None: every chunk), and ``dS`` over
    the backward walk of positions ``t >= bwd_until`` (None: no backward; it needs every chunk's forward).

    The same stages and operations as :func:`run_reference`, so the same values as its ``S``/``dS`` taps,
    without what the states do not need (``o``, the backward's other taps, ``bwd_prepare``, autograd).
    Returns ``{"S", "dS"?}`` chunk-major ``[n_chunks, HV, K, V]`` in math layout, NaN in chunks not walked.
    ``label`` names its stages in ``progress``.
    Example: ``run_states(inputs, config, fwd_until=4)["S"][4]`` is the state entering chunk 4 (B = 1).
    """
    B, T, _, K, V = inputs.shape
    H = inputs.HV
    N, C = inputs.n_seqs, config.chunk_size
    ct = chunk_table(B, T, inputs.cu_seqlens, C)
    if bwd_until is not None:
        fwd_until = None
    with torch.no_grad():
        idx, valid = (x.to(device) for x in ct.token_index())
        _, act = activate(inputs, config, dtype, device)
        x = {n: _to_chunks(t.detach(), idx, valid) for n, t in act.items()}
        vc = _to_chunks(inputs.v.to(device=device, dtype=dtype).reshape(B * T, H, V), idx, valid)
        if progress:
            progress(f"{label}, prepare", 0, 1)
        p = fwd_prepare(x, config.scale)
        if progress:
            progress(f"{label}, prepare", 1, 1)
        S0 = _state_in(inputs.h0, config.state_layout, (N, H, K, V), dtype, device)
        f = fwd_recurrence(p, vc, S0, ct, device, progress, states_only=True, until=fwd_until,
                           label=f"{label}, forward")
        out = {"S": f["S"]}
        if bwd_until is not None:
            doc = _to_chunks(inputs.do.to(device=device, dtype=dtype).reshape(B * T, H, V), idx, valid)
            dhT = _state_in(inputs.dht, config.state_layout, (N, H, K, V), dtype, device)
            out["dS"] = bwd_recurrence(p, f, doc, dhT, ct, device, progress, states_only=True, until=bwd_until,
                                       label=f"{label}, backward")["dS"]
    return out
