"""Forward stage 2, "recurrence" (spec §5): the state pass, sequential over chunks, then the
output pass, parallel over chunks.

State pass, grid (V-blocks, H, N), the longest sequences first (``common.state_grid``): S [K, BV]
fp32 stays in registers; per chunk of the sequence, in order, it stores S (the state entering the
chunk), ``U = u - w S`` (= INV Diag(b) (v - kd S); in bf16 in bf16 mode, ``common.udu_bf16``, and then
the U tap from its fp32 registers), then ``S <- exp(gT) S + kr^T U`` with
``kr = kn exp(gT - gc)`` (bounded by 1), read as ``krT`` [K, C] per chunk from the prepare (the MMA
then needs no register transpose). The last S is ht.
V-blocks of 16 to 64 columns (``tuning.state_block_v``: at most one program per SM): at V = 128, 8
programs per head at H = 16 (128 chains), 4 at H = 32, 2 on a batch of six sequences at H = 32.

In bf16 mode (``fuse_out``) the state pass also forms ``o = qd S + Mqk U`` chunk by chunk, from ``qd``
(bf16, from the token stage) and ``Mqk``; its inputs w, krT and u are bf16 there (``common.fwd_lowp``).

Output pass, grid (NC, H, V-groups): ``o = qd S + Mqk U`` with ``qd = scale qn exp(gc)``, formed once
per program with ``Mqk`` and reused over its V blocks (by default one program per chunk and head); it also
writes the ``S``, ``U`` and ``vcorr = Diag(b) (v - kd S)`` taps (``U``'s where the state pass does not). When
the state pass formed ``o`` it runs over the tap window only and writes the taps alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (LAUNCH, chunk_grid, chunk_launches, fwd_lowp, heads_first, rowscale_mode, s_bf16, seq_order,
                     state_f64, state_grid, tap_kernel_args, udu_bf16)
from .tuning import block_size, cdiv, knob, pipeline_stages, state_block_v, state_tile_cap
from .tlmath import chunk_head_block, exp_, load_qk, mm, mm_operand, mm_tf32, seq_span, store_rn

OUTPUT_TAPS = ("S", "vcorr", "U")


@triton.jit
def _state_mm(a, b, BF16: tl.constexpr, MM_BF16: tl.constexpr, F64: tl.constexpr = 0):
    """A product of the state pass: float64 (``F64``, the fp32 mode's state in float64), bf16 MMA
    (``MM_BF16``, common.fwd_lowp bit 8) or ``mm_tf32``."""
    if F64:
        r = tl.dot(a.to(tl.float64), b.to(tl.float64))
    elif MM_BF16:
        r = mm(a, b, BF16)
    else:
        r = mm_tf32(a, b, BF16)
    return r


@triton.jit(do_not_specialize=["tap_lo", "tap_hi", "n_sel"])
def kda_fwd_recurrence_kernel(
    krT,             # [NC, H, K, BC] fp32 or bf16 (common.fwd_lowp): (kn exp(gT - gc))^T per chunk, 0 on padding rows
    gT,              # [NC, H, K] fp32
    w,               # [BT, H, K] fp32 or bf16: INV Diag(b) kd (WU: kd = kn exp(gc) itself, bf16)
    u,               # [BT, H, V] fp32 or bf16: INV Diag(b) v (WU: v itself)
    b,               # [BT, H] fp32 write strength (WU)
    INV,             # [NC, H, BC, BC] fp32 (I + L)^-1 (WU)
    h0,              # [N, H, K, V] fp32 initial state (math layout), if HAS_H0
    S,               # out [NC, H, K, V] fp32 or bf16 (common.s_bf16): state entering each chunk (STORE_SU)
    U,               # out [BT, H, V] fp32 or bf16 (common.udu_bf16; STORE_SU)
    ht,              # out [N, H, K, V] fp32: final state
    qd,              # [BT, H, K] scale qn exp(gc) (FUSE_OUT; bf16 in bf16 mode)
    Mqk,             # [NC, H, BC, BC] fp32 or bf16 (prepare.mqk_bf16; FUSE_OUT)
    o,               # out [BT, H, V] (FUSE_OUT): qd S + Mqk U, in the caller's output dtype
    chunk_start,     # [NC] int32
    chunk_len,       # [NC] int32
    seq_chunk_base,  # [N + 1] int32
    seq_order,       # [N] int32: sequences in launch order (common.state_grid)
    t_U,             # [hi-lo, n_sel, BC, V] fp32 U tap buffer (TAP_U)
    t_S,             # [hi-lo, n_sel, K, V] fp32 S tap buffer (TAP_S)
    head_slot,       # [H] int32: tap slot of each head, or -1 (TAP_U, TAP_S)
    tap_lo, tap_hi, n_sel,  # tap chunk range and number of tapped heads (TAP_U, TAP_S)
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HAS_H0: tl.constexpr,
    BF16: tl.constexpr,
    U_AHEAD: tl.constexpr = 0,   # 1: u loaded one step ahead into registers (out of the pipeliner's stages)
    MM_BF16: tl.constexpr = 0,   # 1: both products as bf16 MMAs (common.fwd_lowp bit 8), else tf32
    FUSE_OUT: tl.constexpr = 0,  # 1: o formed here, chunk by chunk (the output pass then only writes taps)
    F64: tl.constexpr = 0,       # 1: the state and U carried in float64, stored in fp32 (knob STATE_F64)
    STORE_SU: tl.constexpr = 1,  # 0: S and U not stored (FUSE_OUT without a backward or taps to read them)
    TAP_U: tl.constexpr = 0,     # 1: the U tap stored here, in fp32 (U itself is bf16: common.udu_bf16)
    TAP_S: tl.constexpr = 0,     # 1: the S tap stored here, in fp32 (S itself is bf16: common.s_bf16)
    WU: tl.constexpr = 0,        # 1: U = INV Diag(b) (v - kd S) formed here from v, kd, b, INV (chunk.fuse_wu)
    INV_AHEAD: tl.constexpr = 0,  # 1 (WU): INV loaded one step ahead into registers (out of the pipeline's stages)
    WU_T: tl.constexpr = 0,      # 1 (WU): U formed transposed, U^T = vc^T INV^T (recurrence.wu_transposed)
):
    i_v, i_h, i_n = tl.program_id(0), tl.program_id(1), tl.load(seq_order + tl.program_id(2))
    o_t = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    o_kv = o_k[:, None] * V + o_v[None, :]
    m_kv = m_k[:, None] & m_v[None, :]

    o_nh = (i_n * H + i_h).to(tl.int64)
    acc: tl.constexpr = tl.float64 if F64 else tl.float32
    if HAS_H0:
        b_S = tl.load(h0 + o_nh * K * V + o_kv, mask=m_kv, other=0).to(acc)
    else:
        b_S = tl.zeros([BK, BV], dtype=acc)

    c_lo = tl.load(seq_chunk_base + i_n)
    c_hi = tl.load(seq_chunk_base + i_n + 1)
    bos0, eos = seq_span(chunk_start, chunk_len, c_lo, c_hi)  # chunk rows by arithmetic
    # exp(gT) of the next chunk is loaded one step ahead (the pipeliner leaves loads that feed no
    # tl.dot synchronous, and this one sat between the step's two products). Masks "o_k * 0 + c < n":
    # the interpreter rejects a mask tensor combined with a 0-d bool.
    b_gT = tl.load(gT + (c_lo * H + i_h).to(tl.int64) * K + o_k, mask=m_k & (o_k * 0 + c_lo < c_hi), other=0)
    if U_AHEAD:  # u's tile leaves the shared-memory stages: three stages then fit at 32 columns (H32)
        m_u = (o_t < tl.minimum(eos - bos0, BC))[:, None] & m_v[None, :]
        # kept in u's own dtype until its use: a conversion in the step that loads it (bf16 v, FWD_FUSE_WU) would
        # make the step wait on the load (benchmarks/loop_check.py)
        b_u = tl.load(u + ((bos0 + o_t[:, None]) * H + i_h) * V + o_v[None, :], mask=m_u, other=0)
    o_cc = o_t[:, None] * BC + o_t[None, :]
    if WU:  # b of the next chunk loaded a step ahead, as gT (a load that feeds no tl.dot stays synchronous)
        b_bt = tl.load(b + (bos0 + o_t) * H + i_h, mask=o_t < tl.minimum(eos - bos0, BC), other=0)
    if INV_AHEAD:
        b_inv = tl.load(INV + (c_lo * H + i_h).to(tl.int64) * BC * BC + o_cc, mask=o_cc * 0 + c_lo < c_hi, other=0)
    if TAP_U or TAP_S:  # the head's tap slot, loaded once: inside the loop the load would wait on the step's stores
        slot = tl.load(head_slot + i_h)
    for i_c in range(c_lo, c_hi):
        bos = bos0 + (i_c - c_lo).to(tl.int64) * BC
        n_valid = tl.minimum(eos - bos, BC)
        m_t = o_t < n_valid
        o_tok = bos + o_t
        o_tk = (o_tok[:, None] * H + i_h) * K + o_k[None, :]
        o_tv = (o_tok[:, None] * H + i_h) * V + o_v[None, :]
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        o_ch = (i_c * H + i_h).to(tl.int64)
        b_gT_next = tl.load(gT + (o_ch + H) * K + o_k, mask=m_k & (o_k * 0 + i_c + 1 < c_hi), other=0)
        if WU:
            b_bt_next = tl.load(b + (o_tok + BC) * H + i_h, mask=o_t < eos - bos - BC, other=0)
        if INV_AHEAD:
            b_inv_next = tl.load(INV + (o_ch + H) * BC * BC + o_cc, mask=o_cc * 0 + i_c + 1 < c_hi, other=0)
        if U_AHEAD:
            b_u_next = tl.load(u + o_tv + BC * H * V, mask=(o_t < eos - bos - BC)[:, None] & m_v[None, :],
                               other=0)

        if STORE_SU:
            store_rn(S + o_ch * K * V + o_kv, b_S.to(tl.float32), m_kv)
        if TAP_S:
            if (i_c >= tap_lo) & (i_c < tap_hi) & (slot >= 0):
                tl.store(t_S + ((i_c - tap_lo) * n_sel + slot).to(tl.int64) * K * V + o_kv, b_S.to(tl.float32),
                         mask=m_kv)
        if U_AHEAD:
            b_U = b_u.to(acc)
            b_u = b_u_next
        else:
            b_U = tl.load(u + o_tv, mask=m_tv, other=0).to(acc)
        if WU:  # vcorr = Diag(b) (v - kd S), then U = INV vcorr: the w/u kernel's two products in one
            b_vc = b_bt[:, None] * (b_U - _state_mm(tl.load(w + o_tk, mask=m_tk, other=0), b_S, BF16, MM_BF16, F64))
            b_bt = b_bt_next
            if INV_AHEAD:
                b_Ai = b_inv
                b_inv = b_inv_next
            else:
                b_Ai = tl.load(INV + o_ch * BC * BC + o_cc)
            if WU_T:  # U^T = vc^T INV^T: the product's M is BV (wu_transposed)
                b_U = tl.trans(mm_tf32(tl.trans(b_vc), tl.trans(b_Ai), BF16))
            else:
                b_U = mm_tf32(b_Ai, b_vc, BF16)
        else:
            b_U -= _state_mm(tl.load(w + o_tk, mask=m_tk, other=0), b_S, BF16, MM_BF16, F64)
        if STORE_SU:
            store_rn(U + o_tv, b_U.to(tl.float32), m_tv)
        if TAP_U:  # padding rows: 0 (u and w are read as 0 there)
            if (i_c >= tap_lo) & (i_c < tap_hi) & (slot >= 0):
                tl.store(t_U + ((i_c - tap_lo) * n_sel + slot).to(tl.int64) * BC * V + o_t[:, None] * V + o_v[None, :],
                         b_U.to(tl.float32), mask=(o_t >= 0)[:, None] & m_v[None, :])
        if FUSE_OUT:  # off the chain: S and U of this chunk are final here
            b_qd = tl.load(qd + o_tk, mask=m_tk, other=0)
            b_M = tl.load(Mqk + o_ch * BC * BC + o_t[:, None] * BC + o_t[None, :])
            store_rn(o + o_tv, mm(b_qd, b_S, BF16) + mm(b_M, b_U, BF16), m_tv)

        b_krT = tl.load(krT + (o_ch * K + o_k[:, None]) * BC + o_t[None, :], mask=m_k[:, None], other=0)
        b_S = b_S * exp_(b_gT.to(acc), BF16 == 0)[:, None]
        b_S += _state_mm(b_krT, b_U, BF16, MM_BF16, F64)
        b_gT = b_gT_next

    tl.store(ht + o_nh * K * V + o_kv, b_S.to(tl.float32), mask=m_kv)


@triton.jit(do_not_specialize=["tap_lo", "tap_hi", "n_sel", "c0"])
def kda_fwd_output_kernel(
    qn,              # [BT, H, K] fp32 (with RS: the raw q, times rq)
    kn,              # [BT, H, K] fp32 (vcorr tap only; with RS: the raw k, times rk)
    rq, rk,          # [BT, H] fp32 row scales (RS)
    gc,              # [BT, H, K] fp32
    v,               # [BT, H, V] value (vcorr tap only)
    b,               # [BT, H] fp32 (vcorr tap only)
    Mqk,             # [NC, H, BC, BC] fp32
    S,               # [NC, H, K, V] fp32 or bf16 (common.s_bf16): state entering each chunk
    U,               # [BT, H, V] fp32
    o,               # out [BT, H, V] (fp32, or the caller's output dtype: rounded to nearest)
    chunk_start,     # [NC] int32
    chunk_len,       # [NC] int32
    scale,           # query scale
    t_S, t_vcorr, t_U,  # tap buffers [hi-lo, n_sel, *shape]
    head_slot,       # [H] int32: tap slot of each head, -1 if not tapped
    tap_lo,          # first tapped chunk
    tap_hi,          # one past the last tapped chunk
    n_sel,           # number of tapped heads
    c0,              # first chunk of this launch (common.chunk_launches)
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    NVB: tl.constexpr,           # V blocks of one program: qd and Mqk are formed once for all of them
    BF16: tl.constexpr,
    STORE_TAPS: tl.constexpr,
    TAP_S: tl.constexpr, TAP_VCORR: tl.constexpr, TAP_U: tl.constexpr,
    STORE_O: tl.constexpr = 1,   # 0: the state pass formed o (recurrence.fuse_out): taps only
    RS: tl.constexpr = 0,        # qn, kn from the raw q, k and the row scales (common.rowscale_mode)
    HEADS_FIRST: tl.constexpr = 0,  # 1: a 1-D grid, one chunk's heads adjacent (common.chunk_grid; same bits)
):
    if HEADS_FIRST:
        i_c, i_h, i_vg = chunk_head_block(c0, H, tl.cdiv(tl.cdiv(V, BV), NVB))
    else:
        i_c, i_h, i_vg = tl.program_id(0) + c0, tl.program_id(1), tl.program_id(2)
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n_valid = tl.load(chunk_len + i_c)
    o_t = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    m_t = o_t < n_valid
    m_k = o_k < K
    o_tok = bos + o_t
    o_tk = (o_tok[:, None] * H + i_h) * K + o_k[None, :]
    m_tk = m_t[:, None] & m_k[None, :]
    o_ch = (i_c * H + i_h).to(tl.int64)

    b_gc = tl.load(gc + o_tk, mask=m_tk, other=0)
    b_qd = load_qk(qn, o_tk, m_tk, rq, o_tok * H + i_h, m_t, RS) * scale * exp_(b_gc, BF16 == 0)
    b_qd = mm_operand(tl.where(m_tk, b_qd, 0.0), BF16)
    b_M = mm_operand(tl.load(Mqk + o_ch * BC * BC + o_t[:, None] * BC + o_t[None, :]), BF16)
    if STORE_TAPS:
        i_slot = tl.load(head_slot + i_h)
        tapped = (i_c >= tap_lo) & (i_c < tap_hi) & (i_slot >= 0)
        o_tap = ((i_c - tap_lo) * n_sel + i_slot).to(tl.int64)
        if TAP_VCORR:
            b_kd = tl.where(m_tk, load_qk(kn, o_tk, m_tk, rk, o_tok * H + i_h, m_t, RS) * exp_(b_gc, BF16 == 0), 0.0)
            b_b = tl.load(b + o_tok * H + i_h, mask=m_t, other=0)
    for i_vb in range(NVB):
        o_v = (i_vg * NVB + i_vb) * BV + tl.arange(0, BV)
        m_v = o_v < V
        o_tv = (o_tok[:, None] * H + i_h) * V + o_v[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        o_kv = o_k[:, None] * V + o_v[None, :]
        m_kv = m_k[:, None] & m_v[None, :]
        b_S = tl.load(S + o_ch * K * V + o_kv, mask=m_kv, other=0)
        b_U = tl.load(U + o_tv, mask=m_tv, other=0)
        if STORE_O:
            store_rn(o + o_tv, mm(b_qd, b_S, BF16) + mm(b_M, b_U, BF16), m_tv)
        if STORE_TAPS:
            if tapped:
                o_cv = o_t[:, None] * V + o_v[None, :]
                m_cv = (o_t >= 0)[:, None] & m_v[None, :]
                if TAP_S:
                    tl.store(t_S + o_tap * K * V + o_kv, b_S, mask=m_kv)
                if TAP_U:
                    tl.store(t_U + o_tap * BC * V + o_cv, b_U, mask=m_cv)
                if TAP_VCORR:
                    b_v = tl.load(v + o_tv, mask=m_tv, other=0).to(tl.float32)
                    b_vc = b_b[:, None] * (b_v - mm(b_kd, b_S, BF16))
                    tl.store(t_vcorr + o_tap * BC * V + o_cv, b_vc, mask=m_cv)


def _block_v(K: int, V: int) -> int:
    """V block of the state tile [BK, BV]: at most 64 columns, at most 8192 fp32 elements."""
    return block_size(V, state_tile_cap(K))


def state_pass_plan(C: int, BK: int, BV: int, device, sizes=(4, 4, 4, 4), extra: int = 0) -> tuple[int, int]:
    """``(num_stages, U_AHEAD)`` of the forward state pass for chunk C and a [BK, BV] state tile.

    Three stages (two chunks prefetched): 0.51 -> 0.42 ms at H16 T16384. Per
    stage the w, krT and u tiles; besides, the S operand and a [C, BV] tile. With u loaded one step ahead
    into registers (U_AHEAD), u leaves the stages and a second [C, BV] tile joins the rest, so it can buy
    a stage where shared memory is short. The default takes it where it buys a stage at 32 columns or
    fewer, and in the fused state pass (``extra``: bf16 mode) at 16 columns, where it keeps the stages and
    hides u's load (H16 T16384 pre-gated forward 1.058 -> 1.040 ms, one process on the H200,
    ``docs/gpu/round25/call2``). Not at 64 columns: there the register tile costs more than a stage buys
    (forward 1.820 ms without, 2.069 with on the varlen batch at H32; 1.795 against 2.026 at H64 T8192),
    nor at 32 columns without a stage to gain (H32 T16384: 1.805 against 1.834). ``KDADBG_REC_U_AHEAD`` and
    ``KDADBG_REC_STAGES`` override. ``sizes``: bytes per element of w, krT, u and the products' operands
    (``common.fwd_lowp``); ``extra``: more bytes per stage (the fused output's qd and Mqk tiles)."""
    ew, ek, eu, eo = sizes
    stages = pipeline_stages("REC_STAGES", 3, C * BK * (ew + ek) + eu * C * BV + extra, eo * BV * (BK + C), device)
    stages_u = pipeline_stages("REC_STAGES", 3, C * BK * (ew + ek) + extra, eo * BV * (BK + C) + 4 * C * BV,
                               device)
    # not at 64 columns: there u's [C, BV] tile in registers beside the state's cost more than the stage bought
    u_ahead = knob("REC_U_AHEAD", int((stages_u > stages and BV <= 32)
                                      or (extra > 0 and BV <= 16 and stages_u >= stages)))
    return (stages_u if u_ahead else stages), u_ahead


def wu_transposed(C: int, BV: int) -> bool:
    """Whether the fused state pass (``chunk.fuse_wu``) forms ``U`` transposed, ``U^T = vc^T INV^T``, rather than
    ``U = INV vc``: where the V block is narrower than the chunk. The product's M is then ``BV``, below 64, so
    Triton 3.6 lowers it to ``mma.sync``; as ``INV vc`` at chunk 64 it is a tf32 ``wgmma`` with N = 16 or 32 and
    its B operand (``vc``) written from registers, which with a pipelined loop (2 or 3 stages) gave a wrong ``o``
    and ``ht`` or an illegal memory access on the H100 (``docs/gpu/round59/summary.txt``: every launch at 16 and
    32 columns tried; the transposed form right at 16, 32 and 64 columns). At ``BV == C`` (64) both forms
    are a ``wgmma`` with N = 64, right there; below chunk 64, ``INV vc``'s M is the chunk, below 64."""
    return BV < C


def fuse_out(precision: str) -> bool:
    """Whether the state pass forms ``o`` (``KDADBG_FWD_FUSE_OUT``; default in bf16 mode): it holds ``S``
    and ``U`` of each chunk already, so ``o = qd S + Mqk U`` there reads only ``qd`` and ``Mqk``, where the
    output pass read ``S``, ``U``, ``qn`` and ``gc`` back from memory. The output pass then runs over the
    tap window alone, for the ``S``, ``U`` and ``vcorr`` taps. Not in fp32 mode: there the fused state
    pass's tiles leave room for one pipeline stage instead of three (sm_90 compile,
    ``benchmarks/kernel_resources.py``)."""
    return bool(knob("FWD_FUSE_OUT", int(precision == "bf16")))


def kda_fwd_recurrence(krT, gT, w, u, h0, chunks, *, precision, qd=None, Mqk=None, out_dtype=torch.float32,
                       tap_plan=None, keep_state=True, v=None, b=None, INV=None):
    """State pass. Returns ``S [NC,H,K,V]``, ``U [BT,H,V]`` (fp32, bf16 in bf16 mode: ``common.udu_bf16``),
    ``ht [N,H,K,V]`` (fp32, math layout) and, given ``qd`` and ``Mqk``, ``o [BT,H,V]`` in ``out_dtype`` (else
    None). ``S`` and ``U`` hold the S and U taps when ``tap_plan`` aliases them; with ``U`` in bf16 the U tap
    has a buffer of its own, which this pass stores. ``keep_state=False`` (a forward no backward will follow): where the
    pass forms ``o`` itself and no tap plan is given, ``S`` and ``U`` are neither allocated nor stored
    (returned as None), the bytes of an inference forward; ``o`` and ``ht`` keep their bits. ``u`` None (the
    prepare ran no w/u kernel, ``chunk.fuse_wu``): ``w`` is ``kd = kn exp(gc)`` (bf16) and the pass forms
    ``U = INV Diag(b) (v - kd S)`` from ``v``, ``b`` and ``INV``."""
    wu = u is None
    if wu:
        assert v is not None and b is not None and INV is not None and qd is not None and not state_f64(precision)
        u = v
    BT, H, K = w.shape
    V = u.shape[-1]
    N, NC, C = chunks.n_seqs, chunks.n_chunks, chunks.chunk_size
    dev, f32 = w.device, torch.float32
    fused = qd is not None
    store_su = keep_state or not fused or tap_plan is not None
    s_lowp = s_bf16(precision)
    S = torch.empty(NC, H, K, V, device=dev, dtype=torch.bfloat16 if s_lowp else f32) if store_su else None
    u_lowp = udu_bf16(precision)
    U = torch.empty(BT, H, V, device=dev, dtype=torch.bfloat16 if u_lowp else f32) if store_su else None
    ht = torch.empty(N, H, K, V, device=dev, dtype=f32)
    o = torch.empty(BT, H, V, device=dev, dtype=out_dtype) if fused else None
    for name, lowp in (("U", u_lowp), ("S", s_lowp)):
        if lowp and tap_plan is not None:
            tap_plan.own(name)  # the tap keeps the fp32 values: stored from this pass's registers
    if N == 0:
        return S, U, ht, o
    tap_u = u_lowp and tap_plan is not None and tap_plan.has("U")
    tap_s = s_lowp and tap_plan is not None and tap_plan.has("S")
    tapped = tap_u or tap_s
    if tap_plan is not None:
        tap_plan.alias(chunks, S=S, U=U)
    BV, BK = state_block_v("REC_BV", N * H, K, V, dev, per_sm=1), block_size(K)
    mm_bf16 = int(bool(fwd_lowp(precision) & 8))
    eo = 2 if mm_bf16 else 4
    extra = (C * BK * qd.element_size() + Mqk.element_size() * C * C if fused else 0) + (4 * C if wu else 0)
    sizes = (w.element_size(), krT.element_size(), u.element_size(), eo)
    stages, u_ahead = state_pass_plan(C, BK, BV, dev, sizes, extra + (4 * C * C if wu else 0))
    inv_ahead = 0
    if wu:  # INV out of the stages, one step ahead in registers, where that buys a stage; not at 64 columns,
        # where the state tile's registers leave no room (sm_90: 264 B of stack, 238 KB of shared memory at 3)
        stages_i, u_ahead_i = state_pass_plan(C, BK, BV, dev, sizes, extra)
        inv_ahead = knob("REC_INV_AHEAD", int(stages_i > stages and BV <= 32))
        if inv_ahead:
            stages, u_ahead = stages_i, u_ahead_i
    kda_fwd_recurrence_kernel[state_grid(chunks, H, cdiv(V, BV))](
        krT=krT, gT=gT, w=w, u=u, b=b if wu else ht, INV=INV if wu else ht, h0=h0 if h0 is not None else ht,
        S=S if store_su else ht, U=U if store_su else ht, ht=ht, qd=qd if fused else ht,
        Mqk=Mqk if fused else ht, o=o if fused else ht, chunk_start=chunks.chunk_start,
        chunk_len=chunks.chunk_len, seq_chunk_base=chunks.seq_chunk_base, seq_order=seq_order(chunks),
        t_U=tap_plan.get("U") if tap_u else ht, t_S=tap_plan.get("S") if tap_s else ht,
        head_slot=tap_plan.head_slot if tapped else chunks.chunk_len,
        tap_lo=tap_plan.lo if tapped else 0, tap_hi=tap_plan.hi if tapped else 0,
        n_sel=tap_plan.n_sel if tapped else 0,
        H=H, K=K, V=V, BC=C, BK=BK, BV=BV, HAS_H0=h0 is not None,
        BF16=precision == "bf16", U_AHEAD=u_ahead, MM_BF16=mm_bf16, FUSE_OUT=int(fused), F64=state_f64(precision),
        STORE_SU=int(store_su), TAP_U=int(tap_u), TAP_S=int(tap_s), WU=int(wu), INV_AHEAD=inv_ahead,
        WU_T=int(wu and wu_transposed(C, BV)), **LAUNCH,
        num_warps=knob("REC_WARPS", 4), num_stages=stages,
    )
    return S, U, ht, o


def kda_fwd_output(qn, kn, gc, v, b, Mqk, S, U, chunks, *, scale, precision, tap_plan=None,
                   out_dtype=torch.float32, o=None, rq=None, rk=None, qk_lowp=0):
    """Output pass: ``o [BT,H,V]`` in ``out_dtype`` (and the S, vcorr, U taps). Given ``o`` (formed by the
    state pass, ``fuse_out``), only the taps: it runs over the tap window and leaves ``o`` as it is.
    ``rq, rk``: the l2norm's row scales when ``qn, kn`` are the raw q, k (``prepare.qk_rowscale``,
    ``prepare.rowscale_for_inference``), ``qk_lowp`` the token kernel's rounding (``prepare.qk_lowp_mode``)."""
    BT, H, K = qn.shape
    V = v.shape[-1]
    NC, C = chunks.n_chunks, chunks.chunk_size
    taps_only = o is not None
    if o is None:
        o = torch.empty(BT, H, V, device=qn.device, dtype=out_dtype)
    if NC == 0:
        return o
    # U, S in bf16 (common.udu_bf16, common.s_bf16): the state pass stored their taps from its fp32 registers
    kept = {"U": U, "S": S}
    names = tuple(n for n in OUTPUT_TAPS if kept.get(n) is None or kept[n].dtype == torch.float32)
    bufs, slot, lo, hi, n_sel, store, present = tap_kernel_args(tap_plan, names, o, chunks)
    buf = dict(zip(names, bufs))
    BV = _block_v(K, V)
    # one program forms qd and Mqk once for all the V blocks, with one pipeline stage: 0.195 ms at H16
    # T16384 against 0.243 for one program per 64 columns with three stages (each read qn, gc and Mqk);
    # two stages 0.211, three 0.308
    NVB = knob("OUT_NVB", cdiv(V, BV))
    hf = heads_first()
    for c0, c1, taps in chunk_launches(tap_plan, NC):
        if taps_only and not (taps and store):
            continue
        on = {n: taps and present.get(n, False) for n in OUTPUT_TAPS}
        n_vg = cdiv(cdiv(V, BV), NVB)
        kda_fwd_output_kernel[chunk_grid(c1 - c0, H, n_vg, first=hf, grid=(c1 - c0, H, n_vg))](
            qn=qn, kn=kn, rq=b if rq is None else rq, rk=b if rk is None else rk, gc=gc, v=v, b=b, Mqk=Mqk, S=S,
            U=U, o=o, chunk_start=chunks.chunk_start,
            chunk_len=chunks.chunk_len, scale=float(scale), t_S=buf.get("S", o), t_vcorr=buf["vcorr"], t_U=buf.get("U", o),
            head_slot=slot,
            tap_lo=lo, tap_hi=hi, n_sel=n_sel, c0=c0,
            H=H, K=K, V=V, BC=C, BK=block_size(K), BV=BV, NVB=NVB, BF16=precision == "bf16",
            STORE_TAPS=store and taps, TAP_S=on["S"], TAP_VCORR=on["vcorr"], TAP_U=on["U"],
            STORE_O=not taps_only, RS=rowscale_mode(rq is not None, qk_lowp), HEADS_FIRST=hf, **LAUNCH,
            num_warps=knob("OUT_WARPS", 8 if store and taps and C * block_size(K) > 4096 else 4),
            num_stages=knob("OUT_STAGES", 1),
        )
    return o
