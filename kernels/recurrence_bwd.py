"""Backward recurrence (spec §6.1, the state path): sequential over a sequence's chunks in reverse.

The state gradient obeys ``dS = exp(gT) ⊙ dS⁺ + qd^T dO − kd^T dv`` with
``dv = Diag(b) INV^T dU`` and ``dU = Mqk^T dO + kr dS⁺``. Since ``kd^T Diag(b) INV^T = w^T`` with
``w = INV Diag(b) kd``, the sequential step only needs ``dU = dU0 + kr dS⁺`` and
``dS = exp(gT) ⊙ dS⁺ + qd^T dO − w^T dU``. Two kernels:

- ``chunk_bwd_prep_kernel``, grid (NC, H), parallel: ``qd, kr, w`` [BT,H,K] and ``dU0 = Mqk^T dO``
  [BT,H,V] (written into the ``dU`` buffer);
- ``recurrence_bwd_kernel``, grid (NV, H, N) (``common.state_grid``), sequential: per chunk it stores ``dS⁺`` (the
  gradient arriving from the next chunk, read by the prepare backward), completes ``dU`` (in place, or in
  bf16 into a tensor of its own: ``common.udu_bf16``), and steps ``dS``; after a sequence's chunk 0, ``dS``
  is ``dh0``. Taps ``dS`` and, with ``dU`` in bf16, ``dU`` (from its fp32 registers).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import LAUNCH, chunk_grid, dot_mode, heads_first, seq_order, state_f64, state_grid, udu_bf16
from .tlmath import chunk_head_block, exp_, load_qk, mm, seq_span, store_rn
from .tuning import block_size, cdiv, knob, pipeline_stages, stages_for_residency, state_block_v


@triton.jit
def chunk_bwd_prep_kernel(
    qn, kn,          # [BT, H, K] fp32: normalised q, k (with RS: the raw q, k, times rq, rk)
    rq, rk,          # [BT, H] fp32 row scales (RS)
    gc,              # [BT, H, K] fp32: within-chunk inclusive cumsum of the log-decay
    gT,              # [NC, H, K] fp32: chunk total log-decay
    b,               # [BT, H] fp32: write strength
    INV, Mqk,        # [NC, H, C, C] fp32 (Mqk bf16 in bf16 mode with prepare.mqk_bf16)
    do,              # [BT, H, V] any float dtype
    qd, kr, w,       # [BT, H, K] out (bf16 on the GPU's bf16 mode, else fp32): scale*qn*exp(gc), kn*exp(gT-gc),
                     # INV Diag(b) kn*exp(gc)
    dU,              # [BT, H, V] fp32 out: Mqk^T dO
    chunk_start, chunk_len,  # [NC] int32
    scale,           # query scale
    H, K, V,         # sizes
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
    RS: tl.constexpr = 0,        # qn, kn from the raw q, k and the row scales (fp32 mode: prepare.qk_rowscale)
    STORE_QD: tl.constexpr = 1,  # 0: qd kept from the forward (chunk.bwd_fwd_operands), not formed
    STORE_W: tl.constexpr = 1,   # 0: w kept from the forward
    HEADS_FIRST: tl.constexpr = 0,  # 1: a 1-D grid, one chunk's heads adjacent (common.chunk_grid; same bits)
):
    if HEADS_FIRST:
        i_c, i_h, _ = chunk_head_block(0, H, 1)
    else:
        i_c, i_h = tl.program_id(0), tl.program_id(1)
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)
    o_t = tl.arange(0, C)
    m_t = o_t < n
    m_tt = m_t[:, None] & m_t[None, :]
    o_cc = ((i_c * H + i_h).to(tl.int64) * C + o_t[:, None]) * C + o_t[None, :]
    b_INV = tl.load(INV + o_cc, mask=m_tt, other=0.)
    b_b = tl.load(b + (bos + o_t) * H + i_h, mask=m_t, other=0.)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        o_tk = ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        b_gT = tl.load(gT + (i_c * H + i_h).to(tl.int64) * K + o_k, mask=m_k, other=0.)
        b_gc = tl.load(gc + o_tk, mask=m_tk, other=0.)
        b_gc = tl.where(m_t[:, None], b_gc, b_gT[None, :])
        b_kn = load_qk(kn, o_tk, m_tk, rk, (bos + o_t) * H + i_h, m_t, RS)
        b_E = exp_(b_gc, DOT == 0)
        if STORE_W:
            b_w = mm(b_INV, b_kn * b_E * b_b[:, None], DOT)
            tl.store(w + o_tk, b_w, mask=m_tk)
        if STORE_QD:
            b_qn = load_qk(qn, o_tk, m_tk, rq, (bos + o_t) * H + i_h, m_t, RS)
            tl.store(qd + o_tk, scale * b_qn * b_E, mask=m_tk)
        tl.store(kr + o_tk, b_kn * exp_(b_gT[None, :] - b_gc, DOT == 0), mask=m_tk)
    b_Mqk = tl.load(Mqk + o_cc, mask=m_tt, other=0.)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        o_tv = ((bos + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        b_do = tl.load(do + o_tv, mask=m_tv, other=0.).to(tl.float32)
        tl.store(dU + o_tv, mm(tl.trans(b_Mqk), b_do, DOT), mask=m_tv)


@triton.jit(do_not_specialize=["tap_lo", "tap_hi", "n_sel"])
def recurrence_bwd_kernel(
    qd, kr, w,       # [BT, H, K] fp32 (from chunk_bwd_prep_kernel)
    do,              # [BT, H, V] any float dtype
    dU,              # [BT, H, V] fp32 in: Mqk^T dO (dU0)
    dUo,             # [BT, H, V] out, fp32 or bf16: Mqk^T dO + kr dS⁺ (dU itself, in place, where fp32)
    gT,              # [NC, H, K] fp32
    dht,             # [N, H, K, V] fp32 (math layout), read if USE_DHT
    dSn,             # [NC, H, K, V] fp32 out: dS⁺, the gradient arriving from the next chunk
    dh0,             # [N, H, K, V] fp32 out (math layout), written if STORE_DH0 (and not DH0_SLOT)
    chunk_start, chunk_len,  # [NC] int32
    seq_chunk_base,  # [N+1] int32
    seq_order,       # [N] int32: sequences in launch order (common.state_grid)
    tap_dS,          # [hi-lo, n_sel, K, V] fp32 tap buffer
    tap_dU,          # [hi-lo, n_sel, C, V] fp32 tap buffer (TAP_DU)
    head_slot,       # [H] int32: tap slot of each head, or -1
    tap_lo, tap_hi, n_sel,   # tap chunk range and number of tapped heads
    H, K, V,         # sizes
    n_seqs,          # N (DH0_SLOT)
    fill, fill_n, fill_per,  # with FILL: a flat fp32 tensor of fill_n elements to NaN-fill, fill_per a program
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
    USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, TAP_DS: tl.constexpr, TAP_DU: tl.constexpr,
    DH0_SLOT: tl.constexpr = 0,  # with STORE_DH0: dh0 lies just before dSn in one tensor, stored by one more
                                 # step of the loop, over no rows, into slot i_n - N (knob RECB_DH0_SLOT,
                                 # default 1 at BV >= 32)
    F64: tl.constexpr = 0,       # 1: dS carried in float64, stored in fp32 (common.state_f64)
    FILL: tl.constexpr = 0,      # blocks of FB elements of `fill` NaN-filled per step (0: none)
    FB: tl.constexpr = 512,
):
    i_v, i_h, i_n = tl.program_id(0), tl.program_id(1), tl.load(seq_order + tl.program_id(2))
    c0 = tl.load(seq_chunk_base + i_n)
    c1 = tl.load(seq_chunk_base + i_n + 1)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, C)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None].to(tl.int64) * V + o_v[None, :]
    acc: tl.constexpr = tl.float64 if F64 else tl.float32
    if USE_DHT:
        b_dS = tl.load(dht + (i_n * H + i_h).to(tl.int64) * K * V + o_kv, mask=m_kv, other=0.).to(acc)
    else:
        b_dS = tl.zeros([BK, BV], dtype=acc)
    # chunk rows by arithmetic (tlmath.seq_span), and the next chunk's dU0 and exp(gT) loaded one step
    # ahead: loads that feed no tl.dot stay synchronous under the pipeliner, and these two sat on the
    # step's chain of products. Masks "o * 0 + c < n": the interpreter rejects a mask tensor combined
    # with a 0-d bool.
    bos0, eos = seq_span(chunk_start, chunk_len, c0, c1)
    c_last = tl.maximum(c1 - 1, c0)
    n_last = eos - (bos0 + (c_last - c0).to(tl.int64) * C)
    o_tv = ((bos0 + (c_last - c0).to(tl.int64) * C + o_t[:, None]) * H + i_h) * V + o_v[None, :]
    m_tv = (o_t < n_last)[:, None] & m_v[None, :] & (o_t * 0 + c0 < c1)[:, None]
    b_dU0 = tl.load(dU + o_tv, mask=m_tv, other=0.)
    b_gT = tl.load(gT + (c_last * H + i_h).to(tl.int64) * K + o_k, mask=m_k & (o_k * 0 + c0 < c1), other=0.)
    if TAP_DS or TAP_DU:  # the head's tap slot, loaded once: inside the loop the load would wait on the step's stores
        slot = tl.load(head_slot + i_h)
    n_steps = c1 - c0
    if DH0_SLOT:
        n_steps += 1
    if FILL:  # this program's slice of `fill`, FILL blocks per step: stores that no step waits on
        pid = (tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0) + tl.program_id(0)
        f_lo = pid.to(tl.int64) * fill_per
        f_hi = tl.minimum(f_lo + fill_per, fill_n)
        nan = tl.full([FB], float("nan"), dtype=tl.float32)
    for i in range(n_steps):
        c = c1 - 1 - i
        if FILL:
            for j in tl.static_range(FILL):
                o_f = f_lo + (i * FILL + j) * FB + tl.arange(0, FB)
                tl.store(fill + o_f, nan, mask=o_f < f_hi)
        bos = bos0 + (c - c0).to(tl.int64) * C
        n = tl.minimum(eos - bos, C)
        if DH0_SLOT:
            n = tl.where(c >= c0, n, 0)
        m_t = o_t < n
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        o_ck = (c * H + i_h).to(tl.int64) * K
        # the previous chunk (always full: only a sequence's last chunk is short)
        o_tv_prev = ((bos - C + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        m_prev = (o_t * 0 + c > c0)[:, None] & m_v[None, :]
        b_dU0_prev = tl.load(dU + o_tv_prev, mask=m_prev, other=0.)
        b_gT_prev = tl.load(gT + o_ck - H * K + o_k, mask=m_k & (o_k * 0 + c > c0), other=0.)
        if DH0_SLOT:
            c_st = tl.where(c >= c0, c, i_n - n_seqs)  # the slot the arriving dS goes to
            tl.store(dSn + (c_st * H + i_h).to(tl.int64) * K * V + o_kv, b_dS.to(tl.float32), mask=m_kv)
        else:
            tl.store(dSn + o_ck * V + o_kv, b_dS.to(tl.float32), mask=m_kv)
        o_tk = ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        o_tv = ((bos + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        b_kr = tl.load(kr + o_tk, mask=m_tk, other=0.)
        b_qd = tl.load(qd + o_tk, mask=m_tk, other=0.)
        b_w = tl.load(w + o_tk, mask=m_tk, other=0.)
        b_do = tl.load(do + o_tv, mask=m_tv, other=0.).to(tl.float32)
        # the products in fp32 (Triton 3.6 on sm_90 failed to lower float64 ones here), dS in acc (F64)
        b_dU = b_dU0 + mm(b_kr, b_dS.to(tl.float32), DOT)
        b_dS = (exp_(b_gT.to(acc), DOT == 0)[:, None] * b_dS + mm(tl.trans(b_qd), b_do, DOT).to(acc)
                - mm(tl.trans(b_w), b_dU, DOT).to(acc))
        store_rn(dUo + o_tv, b_dU.to(tl.float32), m_tv)
        if TAP_DU:  # padding rows: 0 (dU0 and kr are read as 0 there)
            if (c >= tap_lo) & (c < tap_hi) & (slot >= 0) & ((c >= c0) | (DH0_SLOT == 0)):
                tl.store(tap_dU + ((c - tap_lo) * n_sel + slot).to(tl.int64) * C * V + o_t[:, None] * V + o_v[None, :],
                         b_dU.to(tl.float32), mask=(o_t >= 0)[:, None] & m_v[None, :])
        b_dU0, b_gT = b_dU0_prev, b_gT_prev
        if TAP_DS:
            if (c >= tap_lo) & (c < tap_hi) & (slot >= 0) & ((c >= c0) | (DH0_SLOT == 0)):
                tl.store(tap_dS + ((c - tap_lo) * n_sel + slot).to(tl.int64) * K * V + o_kv, b_dS.to(tl.float32),
                         mask=m_kv)
    if STORE_DH0 and not DH0_SLOT:
        tl.store(dh0 + (i_n * H + i_h).to(tl.int64) * K * V + o_kv, b_dS.to(tl.float32), mask=m_kv)
    if FILL:  # what a short chain's steps left of the slice
        for o0 in range(f_lo + n_steps * FILL * FB, f_hi, FB):
            o_f = o0 + tl.arange(0, FB)
            tl.store(fill + o_f, nan, mask=o_f < f_hi)


def chunk_bwd_prep(qn, kn, gc, gT, b, INV, Mqk, do, chunks, *, scale: float, precision: str = "fp32",
                   tap_plan=None, rq=None, rk=None, qd=None, w=None):
    """``qd, kr, w`` [BT,H,K] (bf16 on the GPU's bf16 mode, else fp32) and ``dU0 = Mqk^T dO`` [BT,H,V] fp32
    (token-major, flattened B*T). The
    recurrence completes ``dU`` in place (it then holds the dU tap when ``tap_plan`` aliases it), or in bf16
    into a tensor of its own (``common.udu_bf16``), storing the dU tap itself. ``rq, rk``: the
    l2norm's row scales when ``qn, kn`` are the raw q, k (fp32 mode: ``prepare.qk_rowscale``). ``qd``, ``w``: the
    forward's (``chunk.bwd_fwd_operands``), returned as they are and not formed."""
    BT, H, K = qn.shape
    V = do.shape[-1]
    C = chunks.chunk_size
    # on the GPU's bf16 mode they are only ever bf16 MMA operands: stored as such (half the bytes)
    dt = torch.bfloat16 if dot_mode(precision) == 1 else torch.float32
    store_qd, store_w = qd is None, w is None

    def new():
        return torch.empty(BT, H, K, device=qn.device, dtype=dt)

    qd, kr, w = new() if store_qd else qd, new(), new() if store_w else w
    dU = torch.empty(BT, H, V, device=qn.device, dtype=torch.float32)
    if chunks.n_chunks == 0:
        return qd, kr, w, dU
    if tap_plan is not None:
        if udu_bf16(precision):
            tap_plan.own("dU")  # the tap keeps the fp32 values: stored by the reverse state pass
        tap_plan.alias(chunks, dU=dU)
    hf = heads_first()
    chunk_bwd_prep_kernel[chunk_grid(chunks.n_chunks, H, first=hf, grid=(chunks.n_chunks, H))](
        qn=qn, kn=kn, rq=b if rq is None else rq, rk=b if rk is None else rk, gc=gc, gT=gT, b=b, INV=INV,
        Mqk=Mqk, do=do, qd=qd, kr=kr, w=w, dU=dU,
        chunk_start=chunks.chunk_start, chunk_len=chunks.chunk_len, scale=scale, H=H, K=K, V=V,
        C=C, BK=knob("BPREP_BK", block_size(K, hi=64)), BV=knob("BPREP_BV", block_size(V, hi=64)),
        DOT=dot_mode(precision), RS=rq is not None, STORE_QD=store_qd, STORE_W=store_w, HEADS_FIRST=hf, **LAUNCH,
        # 4 warps: the kernel 0.582 -> 0.452 ms against 8 at chunk 64 (lower-bound H32 T16384, the same bits:
        # docs/gpu/round30/call9)
        num_warps=knob("BPREP_WARPS", 4), num_stages=knob("BPREP_STAGES", 3))
    return qd, kr, w, dU


def bwd_state_stages(n_chains: int, K: int, V: int, C: int, BV: int, e: int, e_do: int, device) -> int:
    """Pipeline stages of the backward state pass (knob ``RECB_STAGES``). Per stage the kr, qd, w tiles
    (``e`` bytes an element: bf16 in the GPU's bf16 mode, else fp32) and the dO tile (``e_do``); besides,
    the dS operand and two [C, BV] tiles. Two stages where two programs then share an SM (more programs
    than SMs), else three (``tuning.stages_for_residency``); fewer where shared memory is short. A launch
    choice: the same bits."""
    BK = block_size(K)
    per_stage, fixed = C * (3 * BK * e + BV * e_do), e * BV * (BK + 2 * C)
    want = stages_for_residency(n_chains * cdiv(V, BV), per_stage, fixed, device)
    return pipeline_stages("RECB_STAGES", want, per_stage, fixed, device)


def recurrence_bwd(qd, kr, w, do, dU, gT, dht, chunks, *, has_h0: bool, precision: str = "fp32", tap_plan=None,
                   dU_out=None):
    """Run the reverse state recurrence. Completes ``dU`` (``dU0`` on entry) in place, or into ``dU_out``
    (``[BT,H,V]``, fp32 or bf16: ``common.udu_bf16``); with ``tap_plan``'s dU tap stored (not aliased),
    stores that tap from its fp32 registers.

    Returns ``(dSn [NC,H,K,V], dh0 [N,H,K,V] or None)``; ``dSn[c]`` is the gradient arriving at
    chunk c from its successor (``dht`` for a sequence's last chunk).
    """
    BT, H, K = qd.shape
    V = do.shape[-1]
    dev = qd.device
    # the dS tap aliased: read from dSn and dh0 (TapPlan.alias), so dh0 is stored without h0 too; for one
    # sequence both are views of one tensor, dh0 first, which then holds the dS tap of every chunk in order.
    alias_dS = tap_plan is not None and "dS" in tap_plan.aliased
    store_dh0 = has_h0 or alias_dS
    N, NC = chunks.n_seqs, chunks.n_chunks
    # per_sm 6: the six-sequence varlen batch at H32 was fastest at 32 columns (768 programs), dense H16
    # and H32 at 16 (measured: docs/kernels.md)
    BV = state_block_v("RECB_BV", N * H, K, V, dev, per_sm=6)
    # RECB_DH0_SLOT (default 1 at 32 columns or more): dh0 just before dSn, stored by one more step of the
    # loop (the kernel's DH0_SLOT). At 32 columns the sm_90 build of Triton 3.6 spills with the store after
    # the loop, not with this, and the pass is as fast as without dh0; at 16 columns neither spills and the
    # extra step costs a little (measured: docs/kernels.md, Taps)
    dh0_slot = store_dh0 and bool(knob("RECB_DH0_SLOT", 1 if BV >= 32 else 0))
    ext = None
    if dh0_slot or (alias_dS and N == 1):
        ext = torch.empty(N + NC, H, K, V, device=dev, dtype=torch.float32)
        dh0, dSn = ext[:N], ext[N:]
    else:
        dSn = torch.empty(NC, H, K, V, device=dev, dtype=torch.float32)
        dh0 = torch.empty(N, H, K, V, device=dev, dtype=torch.float32) if store_dh0 else None
    if N == 0:
        return dSn, dh0 if has_h0 else None
    if alias_dS:
        tap_plan.alias(chunks, dS=(dSn, dh0, ext if N == 1 else None))
    BK = block_size(K)
    stages = bwd_state_stages(N * H, K, V, chunks.chunk_size, BV, qd.element_size(), do.element_size(), dev)
    tap = tap_plan is not None and tap_plan.has("dS")
    tap_du = tap_plan is not None and tap_plan.has("dU")
    dummy = dSn
    grid = state_grid(chunks, H, cdiv(V, BV))
    # the tap plan's unfilled buffers (the V and K passes' and the finish kernel's taps, STATE_FILL_TAPS):
    # NaN-filled here, a few blocks a step, while each program's chain waits on its products
    fill = tap_plan.take_unfilled() if tap_plan is not None else None
    fb = 512
    n_prog = grid[0] * grid[1] * grid[2]
    fill_n = 0 if fill is None else fill.numel()
    fill_per = cdiv(cdiv(fill_n, n_prog), fb) * fb
    # blocks a step: a power of two (few compiled variants) with which the longest chain covers its slice
    fill_blocks = 0 if fill is None else triton.next_power_of_2(cdiv(fill_per, fb * max(chunks.max_chunks, 1)))
    recurrence_bwd_kernel[grid](
        qd=qd, kr=kr, w=w, do=do, dU=dU, dUo=dU if dU_out is None else dU_out, gT=gT,
        dht=dht if dht is not None else dummy, dSn=dSn,
        dh0=dh0 if store_dh0 else dummy, chunk_start=chunks.chunk_start, chunk_len=chunks.chunk_len,
        seq_chunk_base=chunks.seq_chunk_base, seq_order=seq_order(chunks),
        tap_dS=tap_plan.get("dS") if tap else dummy, tap_dU=tap_plan.get("dU") if tap_du else dummy,
        head_slot=tap_plan.head_slot if tap or tap_du else chunks.chunk_len,
        tap_lo=tap_plan.lo if tap or tap_du else 0, tap_hi=tap_plan.hi if tap or tap_du else 0,
        n_sel=tap_plan.n_sel if tap or tap_du else 0,
        H=H, K=K, V=V, n_seqs=N, fill=dummy if fill is None else fill, fill_n=fill_n, fill_per=fill_per,
        C=chunks.chunk_size, BK=BK, BV=BV, DOT=dot_mode(precision),
        USE_DHT=dht is not None, STORE_DH0=store_dh0, TAP_DS=tap, TAP_DU=tap_du, DH0_SLOT=dh0_slot,
        F64=state_f64(precision),
        FILL=fill_blocks, FB=fb, **LAUNCH,
        num_warps=knob("RECB_WARPS", 4), num_stages=stages)
    if not has_h0:
        return dSn, None
    return dSn, dh0 if ext is None else dh0.clone()  # a gradient that does not hold dSn's memory
