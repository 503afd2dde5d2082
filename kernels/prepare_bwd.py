"""Backward prepare (spec §6.1 chunk-local part, §6.3–§6.5): parallel over chunks.

``chunk_bwd_dqkg_v_kernel`` (the V pass), grid (NK, NC, H): a loop over V tiles reduces
``dMqk = tril(dO U^T)``, ``dL = −stril(dvcorr U^T)`` (``dvcorr = INV^T dU``), ``dO S^T``,
``dvcorr S^T``, ``dkr = U dS⁺^T`` and ``rowsum_v(dS⁺ ⊙ S)``; the K-block 0 program also writes
``dv = b ⊙ dvcorr``. Its results go to the K pass through global memory.

``chunk_bwd_dqkg_kernel`` (the K pass), grid (NK, NC, H), one K-block of one chunk of one head:

1. the collapsed prepare backward (P5): ``E⊙dqd``, ``E⊙dkd``, ``E⁻⊙dki``, ``R⊙dkr`` are formed
   without ``exp(−gc)``: each intra-chunk product ``Σ_j A[i,j] x_j exp(gc_i − gc_j)`` is split over
   16-row blocks with an anchor ``a = gc`` at a block's first row, so every exponential is ``≤ 1``
   on one side and ``≤ exp(15·|decay|)`` on the other. In the bf16 modes each block is a
   [C, 16]·[16, BK] product with A's block read from memory (P by column blocks, Q by row blocks);
   fp32 mode keeps [C, C]·[C, BK] products masked to the block (``BLOCKED``: docs/kernels.md);
2. ``dqn, dkn, dgc, dgT``, the reverse cumsum ``dγ``, the gate chain (``dg`` and per-chunk partials
   of ``dA_log`` and ``ddt_bias``) and this K-block's share of ``db``
   (``db = rowsum(dvcorr ⊙ v) + rowsum(kn ⊙ X)``, ``X = E ⊙ (−dvcorr S^T + dL ki)``, which is
   ``rowsum(dvcorr ⊙ W) + rowsum(dL ⊙ F)`` without W, F or a division by b).

``chunk_bwd_finish_kernel``, grid (NC, H): the L2-norm backward of q and k over full rows
(in place on ``dq``/``dk``), the K-block sum of ``db`` and the beta sigmoid.

Taps: dvcorr, dMqk, dL in the V pass, dkr, dqd, dkd, dki, dgT, dgc in the K pass, db in the
finish kernel. dqd, dkd, dki are their definitional values, so that no product meets an overflowed
``exp(−gc)``; where the true value exceeds fp32 (chunk 32/64 with strong gates) the tap is inf. In the
bf16 modes ``dMqk ki`` and ``dL ki`` are the P loop's sums (the products the gradients use) times
``exp(−gc)`` (``_unscale``); in fp32 mode the P loop's per-16-row anchored products times ``exp(−a)``
(``_p_rows_full``). ``dki = (E⁻⊙dki) ⊙ E`` is always finite. No gradient reads them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import LAUNCH, chunk_grid, chunk_launches, dot_mode, heads_first
from .tlmath import (GATE_IDS, chunk_head_block, div_, exp_, load_qk, log_, mm, prefetch_l2, rsqrt_, slot_index,
                     store_rn, tap_index, truncate_mantissa)
from .tuning import block_size, cdiv, knob, reg_cap

V_TAPS = ("dvcorr", "dMqk", "dL")  # dU: the reverse state pass stores it (recurrence_bwd)
K_TAPS = ("dkr", "dqd", "dkd", "dki", "dgT", "dgc")
DQKG_TAPS = V_TAPS + K_TAPS


@triton.jit(do_not_specialize=["c0"])
def chunk_bwd_dqkg_v_kernel(
    b,               # [BT, H] fp32
    INV,             # [NC, H, C, C] fp32
    S, dSn,          # [NC, H, K, V]: state entering each chunk (fp32, bf16: common.s_bf16); dS arriving (fp32)
    U, dU,           # [BT, H, V] fp32 or bf16 (common.udu_bf16): MMA operands only
    v, do,           # [BT, H, V] any float dtype
    dv,              # [BT, H, V] out (K-block 0 only; fp32 or the caller's dtype)
    dMqk, dL,        # [NC, H, C, C] fp32 out (K-block 0 only): tril(dO U^T), -stril(dvcorr U^T)
    dOS, dcS, dkr,   # [BT, H, K] fp32 out: dO S^T, dvcorr S^T, U dS⁺^T
    dgTs,            # [NC, H, K] fp32 out: rowsum_v(dS⁺ ⊙ S)
    dbv,             # [BT, H] fp32 out (K-block 0 only): rowsum(dvcorr ⊙ v)
    t_dvcorr, t_dMqk, t_dL,  # tap buffers
    head_slot, tap_lo, tap_hi, n_sel,  # tap plan
    chunk_start, chunk_len,  # [NC] int32
    c0,              # first chunk of this launch (common.chunk_launches)
    H, K, V,         # sizes
    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
    TAP_DVCORR: tl.constexpr, TAP_DMQK: tl.constexpr, TAP_DL: tl.constexpr,
    UNCOND: tl.constexpr = 0,    # the V-only products in every K-block, not under `if first` (see the host)
    HEADS_FIRST: tl.constexpr = 0,  # 1: a 1-D grid, one chunk's heads adjacent (common.chunk_grid; same bits)
):
    if HEADS_FIRST:
        i_c, i_h, i_k = chunk_head_block(c0, H, tl.cdiv(K, BK))
    else:
        i_k, i_c, i_h = tl.program_id(0), tl.program_id(1) + c0, tl.program_id(2)
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)
    first = i_k == 0
    o_t = tl.arange(0, C)
    o_k = i_k * BK + tl.arange(0, BK)
    m_t, m_k = o_t < n, o_k < K
    m_tt = m_t[:, None] & m_t[None, :]
    m_tk = m_t[:, None] & m_k[None, :]
    o_ch = (i_c * H + i_h).to(tl.int64)
    o_cc = (o_ch * C + o_t[:, None]) * C + o_t[None, :]
    o_tk = ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :]
    idx, on = tap_index(i_c, i_h, tap_lo, tap_hi, head_slot, n_sel)

    b_INV = tl.load(INV + o_cc, mask=m_tt, other=0.)
    b_b = tl.load(b + (bos + o_t) * H + i_h, mask=m_t, other=0.)
    b_dMqk = tl.zeros([C, C], dtype=tl.float32)
    b_dL = tl.zeros([C, C], dtype=tl.float32)
    b_dOS = tl.zeros([C, BK], dtype=tl.float32)
    b_dcS = tl.zeros([C, BK], dtype=tl.float32)
    b_dkr = tl.zeros([C, BK], dtype=tl.float32)
    b_dgTs = tl.zeros([BK], dtype=tl.float32)
    b_dbv = tl.zeros([C], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_tv = m_t[:, None] & m_v[None, :]
        m_kv = m_k[:, None] & m_v[None, :]
        o_tv = ((bos + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        o_kv = (o_ch * K + o_k[:, None]) * V + o_v[None, :]
        b_do = tl.load(do + o_tv, mask=m_tv, other=0.).to(tl.float32)
        b_U = tl.load(U + o_tv, mask=m_tv, other=0.)
        b_dU = tl.load(dU + o_tv, mask=m_tv, other=0.)
        b_S = tl.load(S + o_kv, mask=m_kv, other=0.)
        b_dSp = tl.load(dSn + o_kv, mask=m_kv, other=0.)
        b_dvc = mm(tl.trans(b_INV), b_dU, DOT)
        b_dOS += mm(b_do, tl.trans(b_S), DOT)
        b_dcS += mm(b_dvc, tl.trans(b_S), DOT)
        b_dkr += mm(b_U, tl.trans(b_dSp), DOT)
        b_dgTs += tl.sum(b_dSp * b_S.to(tl.float32), axis=1)
        if UNCOND:
            b_dMqk += mm(b_do, tl.trans(b_U), DOT)
            b_dL += mm(b_dvc, tl.trans(b_U), DOT)
            b_dbv += tl.sum(b_dvc * tl.load(v + o_tv, mask=m_tv, other=0.).to(tl.float32), axis=1)
        elif first:  # the V-only products, once per chunk
            b_dMqk += mm(b_do, tl.trans(b_U), DOT)
            b_dL += mm(b_dvc, tl.trans(b_U), DOT)
            b_v = tl.load(v + o_tv, mask=m_tv, other=0.).to(tl.float32)
            b_dbv += tl.sum(b_dvc * b_v, axis=1)
        if first:
            store_rn(dv + o_tv, b_b[:, None] * b_dvc, m_tv)
            m_pv = (o_t >= 0)[:, None] & m_v[None, :]
            if TAP_DVCORR and on:
                tl.store(t_dvcorr + idx * C * V + o_t[:, None] * V + o_v[None, :], b_dvc, mask=m_pv)
    tl.store(dOS + o_tk, b_dOS, mask=m_tk)
    tl.store(dcS + o_tk, b_dcS, mask=m_tk)
    tl.store(dkr + o_tk, b_dkr, mask=m_tk)
    tl.store(dgTs + o_ch * K + o_k, b_dgTs, mask=m_k)
    if first:
        b_dMqk = tl.where((o_t[:, None] >= o_t[None, :]) & m_tt, b_dMqk, 0.)
        b_dL = tl.where((o_t[:, None] > o_t[None, :]) & m_tt, -b_dL, 0.)
        tl.store(dMqk + o_cc, b_dMqk)
        tl.store(dL + o_cc, b_dL)
        tl.store(dbv + (bos + o_t) * H + i_h, b_dbv, mask=m_t)
        if on:
            o_pcc = idx * C * C + o_t[:, None] * C + o_t[None, :]
            if TAP_DMQK:
                tl.store(t_dMqk + o_pcc, b_dMqk)
            if TAP_DL:
                tl.store(t_dL + o_pcc, b_dL)


@triton.jit
def scale_exp_cols(p, x, PRECISE: tl.constexpr):
    """``p * exp(x)`` for ``x`` of shape [1, BK] (one exponent per column; taps only): three factors
    ``exp(min(x, 80))``, ``exp(clamp(x - 80, 0, 80))``, ``exp(clamp(x - 160, 0, 88))``, each finite,
    multiplied in turn, so no partial product exceeds the result: it overflows only where the result
    does (past x = 248 it does for any nonzero fp32 p), and p = 0 gives 0. Three multiplies per
    element; the exponentials are per column."""
    b_1 = exp_(tl.minimum(x, 80.), PRECISE)
    b_2 = exp_(tl.minimum(tl.maximum(x - 80., 0.), 80.), PRECISE)
    b_3 = exp_(tl.minimum(tl.maximum(x - 160., 0.), 88.), PRECISE)
    return p * b_1 * b_2 * b_3


@triton.jit
def mm_x3(a, b, DOT: tl.constexpr, SPLIT: tl.constexpr):
    """fp32-accurate product for the gate-sensitive intra-chunk terms in the bf16 modes (their
    cancellation in dg, dA_log and ddt_bias exposes single-tf32 errors), IEEE in fp32 mode.

    SPLIT 3 (chunks of 16 and 32): three tf32 MMAs (``tf32x3``). SPLIT 2 (the default at chunk 64):
    two, ``a·hi(b) + a·lo(b)`` with ``hi(b)`` b's tf32 truncation and ``lo(b) = b - hi(b)``: b (the keys
    or queries with their decay) kept to about fp32, a (dMqk, dL) to tf32; 0.44 ms less than SPLIT 3 at
    H16 T16384 on the H200 (3.26 against 3.70 ms), and it passes the GPU tests. In CPU emulation at
    chunk 64 over 8 seeds (``benchmarks/bf16_margin.py``, docs/margin/) it matches SPLIT 3 on the L2-normalised cases, but with raw keys (``raw``) ddt_bias
    reaches 2.70x its bar (mean 1.58x) against 0.86x (0.51x). At chunk 32 `chunk32`'s dA_log reached
    1.06x (0.90x with SPLIT 3), hence SPLIT 3 there. Keeping a exact instead was far worse (ddt_bias
    1.87x on `chunk64_varlen`). SPLIT 1, one tf32 MMA (as fla's backward), is not used: in the same
    emulation over the chunk-64 cases (``docs/margin/chunk64_cases_split1.log`` against ``..._split2.log``)
    it roughly doubled ddt_bias's error, which then missed its bar on `chunk64` (4.35x), `chunk64_varlen`
    (1.95x) and `kimi_c64` (1.24x), and fla_layer's dA_log (1.43x), where SPLIT 2 stays under 0.95x and 0.53x.
    Under the interpreter (DOT 2) tf32 operands are truncated as the tensor cores read them; tf32x3 is
    taken as IEEE."""
    if DOT == 1:
        if SPLIT == 1:
            return tl.dot(a, b, input_precision="tf32")
        elif SPLIT == 2:
            hi = truncate_mantissa(b, 13)
            return tl.dot(a, hi, input_precision="tf32") + tl.dot(a, b - hi, input_precision="tf32")
        else:
            return tl.dot(a, b, input_precision="tf32x3")
    elif DOT == 2 and SPLIT == 1:
        return tl.dot(truncate_mantissa(a, 13), truncate_mantissa(b, 13), input_precision="ieee")
    elif DOT == 2 and SPLIT == 2:
        hi, at = truncate_mantissa(b, 13), truncate_mantissa(a, 13)
        return (tl.dot(at, hi, input_precision="ieee")
                + tl.dot(at, truncate_mantissa(b - hi, 13), input_precision="ieee"))
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def row_sums(x, o_t, SUFFIX: tl.constexpr, DOT: tl.constexpr):
    """Along the chunk axis: ``sum_{r >= i} x[r]`` (SUFFIX 1) or ``sum_{r < i} x[r]`` (SUFFIX 0).

    In fp32 mode as an IEEE product with a 0/1 triangle, whose FMA order is fixed: ``tl.cumsum``'s
    order follows the register layout the compiler picks, and on the H200 (Triton 3.6) switching taps
    on moved this scan to another layout and changed dg's last bits. The bf16 modes keep the scan (no
    extra MMAs there), whose layout is the same with taps on and off, except with a padded K block
    (K = 8 at chunks 32 and 64): the K pass then passes DOT 0."""
    if DOT == 0:
        if SUFFIX:
            m = o_t[None, :] >= o_t[:, None]
        else:
            m = o_t[None, :] < o_t[:, None]
        return tl.dot(m.to(tl.float32), x, input_precision="ieee")
    elif SUFFIX:
        return tl.cumsum(x, axis=0, reverse=True)
    else:
        return tl.cumsum(x, axis=0) - x


@triton.jit
def _p_rows_full(I, o_t, b_gc, b_kn, b_dd, b_dMs, b_dL, DOT: tl.constexpr, SPLIT: tl.constexpr,
                 TAP: tl.constexpr):
    """(fp32 mode) Rows of 16-row block I of sum_j A[i,j] kn_j e^(gc_i-gc_j) for A = dMs and dL,
    anchored at a = gc[16 I]: a [C, C] x [C, BK] product masked to the block. With ``TAP``, also the
    block's rows of ``dMqk ki`` and ``dL ki`` (for the dqd and dkd taps): the same anchored products,
    dMqk's diagonal ``b_dd`` added, times e^(-a)."""
    b_a = tl.sum(tl.where(o_t[:, None] == I * 16, b_gc, 0.), axis=0)
    m_r = ((o_t >= I * 16) & (o_t < I * 16 + 16))[:, None]
    m_c = (o_t < I * 16 + 16)[:, None]
    b_er = exp_(tl.where(m_r, b_gc - b_a[None, :], 0.), DOT == 0)
    b_kc = tl.where(m_c, b_kn * exp_(tl.where(m_c, b_a[None, :] - b_gc, 0.), DOT == 0), 0.)
    b_mq = mm_x3(b_dMs, b_kc, DOT, SPLIT)
    b_ml = mm_x3(b_dL, b_kc, DOT, SPLIT)
    t_q, t_l = 0., 0.
    if TAP:
        t_q = scale_exp_cols(b_mq + _diag_rows(m_r, b_dd, b_kn, b_a, b_gc, DOT), -b_a[None, :], DOT == 0)
        t_q = tl.where(m_r, t_q, 0.)
        t_l = tl.where(m_r, scale_exp_cols(b_ml, -b_a[None, :], DOT == 0), 0.)
    return tl.where(m_r, b_er * b_mq, 0.), tl.where(m_r, b_er * b_ml, 0.), t_q, t_l


@triton.jit
def _store_tap(t, idx, x, o_t, o_k, m_k, K, C: tl.constexpr):
    """Store ``x`` [C, BK] into slot ``idx`` of a [*, C, K] tap buffer, the addresses formed at the
    store (one address tile for every tap, formed before the loops, would be live through them)."""
    tl.store(t + idx * C * K + o_t[:, None] * K + o_k[None, :], x, mask=(o_t >= 0)[:, None] & m_k[None, :])


@triton.jit
def _unscale(x, b_gc, PRECISE: tl.constexpr):
    """(taps only) ``x e^(-gc)`` for the dqd/dkd taps in the bf16 modes, x being the P loop's sum (``P[i] =
    sum_j A[i,j] kn_j e^(gc_i - gc_j)``, the precision the gradients get): e^(-gc/2) twice, each finite down
    to gc = -177 (e^(-gc) alone overflows below -88), so the tap overflows only where its value does (past
    -177, for any x fp32 holds normal); x = 0 gives 0. A sum's terms of relative size below e^-87 (their
    decay factor underflows) are lost, far below any tolerance of the cell's largest values."""
    b_h = exp_(-0.5 * b_gc, PRECISE)
    return tl.where(x == 0., 0., (x * b_h) * b_h)


@triton.jit
def _store_last_row(p, x, o_t, m_k, C: tl.constexpr):
    """Store row ``C - 1`` of ``x`` [C, BK] at ``p`` [C, BK] (every row's pointers the same row's)."""
    tl.store(p, x, mask=(o_t == C - 1)[:, None] & m_k[None, :])


@triton.jit
def _diag_rows(m_r, b_dd, b_kn, b_a, b_gc, DOT: tl.constexpr):
    """(taps only) dMqk's diagonal term ``dd_i kn_i e^(a - gc_i)`` on the rows ``m_r`` of one 16-row
    block anchored at ``a``, 0 elsewhere: added to the block's anchored product before its e^(-a), so
    that a row's dqd tap overflows once rather than as inf - inf."""
    return tl.where(m_r, b_dd[:, None] * b_kn * exp_(tl.where(m_r, b_a[None, :] - b_gc, 0.), DOT == 0), 0.)


@triton.jit
def _q_rows_full(I, o_t, b_gc, b_qn, b_kn, b_dMs, b_dbL, DOT: tl.constexpr, SPLIT: tl.constexpr):
    """(fp32 mode) Block I's share of sum_{i in I} A[i,j] y_i e^(gc_i-gc_j) (A, y = dMs, qn and b dL, kn),
    anchored at gc[16 I]: a [C, C] x [C, BK] product masked to the block."""
    b_a = tl.sum(tl.where(o_t[:, None] == I * 16, b_gc, 0.), axis=0)
    m_r = ((o_t >= I * 16) & (o_t < I * 16 + 16))[:, None]
    m_c = (o_t < I * 16 + 16)[:, None]
    b_er = tl.where(m_r, exp_(tl.where(m_r, b_gc - b_a[None, :], 0.), DOT == 0), 0.)
    b_ec = exp_(tl.where(m_c, b_a[None, :] - b_gc, 0.), DOT == 0)
    return (tl.where(m_c, b_ec * mm_x3(tl.trans(b_dMs), b_qn * b_er, DOT, SPLIT), 0.),
            tl.where(m_c, b_ec * mm_x3(tl.trans(b_dbL), b_kn * b_er, DOT, SPLIT), 0.))


@triton.jit
def _rows(x, bos, n, J, i_h, o_k, m_k, H, K):
    """Rows [16 J, 16 J + 16) of the chunk's [BT, H, K] tensor ``x`` (fp32, 0 on padding)."""
    return _rows_qk(x, x, bos, n, J, i_h, o_k, m_k, H, K, 0)


@triton.jit
def _rows_qk(x, rx, bos, n, J, i_h, o_k, m_k, H, K, RS: tl.constexpr):
    """Rows [16 J, 16 J + 16) of ``qn`` or ``kn`` (``_rows``; with ``RS`` the raw q or k times its row
    scale ``rx``, ``tlmath.load_qk``)."""
    r = J * 16 + tl.arange(0, 16)
    p = ((bos + r)[:, None] * H + i_h) * K + o_k[None, :]
    return load_qk(x, p, (r < n)[:, None] & m_k[None, :], rx, (bos + r) * H + i_h, r < n, RS)


@triton.jit
def _block_rows(x, rx, gc, gT_row, bos, n, J, i_h, o_k, m_k, H, K, RS: tl.constexpr):
    """Rows [16 J, 16 J + 16) of the chunk: ``x`` (``qn`` or ``kn``: ``_rows_qk``) and ``gc`` (padding
    rows carry the chunk total ``gT_row``), with the anchor ``a = gc[16 J]``."""
    r = J * 16 + tl.arange(0, 16)
    b_g = tl.where((r < n)[:, None], _rows(gc, bos, n, J, i_h, o_k, m_k, H, K), gT_row[None, :])
    b_a = tl.sum(tl.where((tl.arange(0, 16) == 0)[:, None], b_g, 0.), axis=0)
    return _rows_qk(x, rx, bos, n, J, i_h, o_k, m_k, H, K, RS), b_g, b_a


@triton.jit
def _p_block(J, o_t, b_gc, b_gT, kn, rk, gc, dMqk, dL, o_cc0, bos, n, i_h, o_k, m_k, H, K, C: tl.constexpr,
             DOT: tl.constexpr, SPLIT: tl.constexpr, RS: tl.constexpr):
    """Columns j of block J of P[i] = sum_j A[i,j] kn_j e^(gc_i-gc_j) for A = dMs (the strict lower
    dMqk) and dL; A's [C, 16] column block comes from memory. Anchored at a = gc[16 J], the block's first
    row and largest gc: e^(gc_i-a) <= 1 on the rows i >= 16 J that pair with it, e^(a-gc_j) <=
    e^(15 |gamma|max) on its columns. (Anchored at its last row instead, the bounds swap; on the CPU that
    was less accurate: fp32 t65's ddt_bias 1.04e-5 against its 1e-5 bar.)"""
    b_kJ, b_gJ, b_a = _block_rows(kn, rk, gc, b_gT, bos, n, J, i_h, o_k, m_k, H, K, RS)
    b_kc = b_kJ * exp_(b_a[None, :] - b_gJ, DOT == 0)
    r = J * 16 + tl.arange(0, 16)
    m_r = (o_t >= J * 16)[:, None]
    b_er = tl.where(m_r, exp_(tl.where(m_r, b_gc - b_a[None, :], 0.), DOT == 0), 0.)
    p_A = o_cc0 + o_t[:, None] * C + r[None, :]
    b_A = tl.where(o_t[:, None] > r[None, :], tl.load(dMqk + p_A), 0.)
    b_mq = mm_x3(b_A, b_kc, DOT, SPLIT)
    b_ml = mm_x3(tl.load(dL + p_A), b_kc, DOT, SPLIT)
    return b_er * b_mq, b_er * b_ml


@triton.jit
def _q_block(I, o_t, b_gc, b_gT, qn, kn, rq, rk, gc, b, dMqk, dL, o_cc0, bos, n, i_h, o_k, m_k, H, K,
             C: tl.constexpr, DOT: tl.constexpr, SPLIT: tl.constexpr, RS: tl.constexpr):
    """Rows i of block I's share of Q[j] = sum_i A[i,j] y_i e^(gc_i-gc_j) for (A, y) = (dMs, qn) and
    (Diag(b) dL, kn), anchored at a = gc[16 I]: e^(gc_i-a) <= 1 on the block's rows, e^(a-gc_j) <=
    e^(15 |gamma|max) on the columns j < 16 (I + 1) it pairs with; A's rows come from memory, transposed."""
    b_qI, b_gI, b_a = _block_rows(qn, rq, gc, b_gT, bos, n, I, i_h, o_k, m_k, H, K, RS)
    b_kI = _rows_qk(kn, rk, bos, n, I, i_h, o_k, m_k, H, K, RS)
    b_er = exp_(b_gI - b_a[None, :], DOT == 0)
    r = I * 16 + tl.arange(0, 16)
    b_bI = tl.load(b + (bos + r) * H + i_h, mask=r < n, other=0.)
    p_AT = o_cc0 + r[None, :] * C + o_t[:, None]                  # [C, 16]: A[16 I + i, j] at [j, i]
    b_AT = tl.where(r[None, :] > o_t[:, None], tl.load(dMqk + p_AT), 0.)
    b_bLT = b_bI[None, :] * tl.load(dL + p_AT)
    m_c = (o_t < I * 16 + 16)[:, None]
    b_ec = tl.where(m_c, exp_(tl.where(m_c, b_a[None, :] - b_gc, 0.), DOT == 0), 0.)
    return b_ec * mm_x3(b_AT, b_qI * b_er, DOT, SPLIT), b_ec * mm_x3(b_bLT, b_kI * b_er, DOT, SPLIT)


@triton.jit(do_not_specialize=["c0"])
def chunk_bwd_dqkg_kernel(
    qn, kn,          # [BT, H, K] fp32 (with RS: the raw q, k, times rq, rk)
    rq, rk,          # [BT, H] fp32 row scales (RS)
    gc,              # [BT, H, K] fp32 within-chunk cumsum of the log-decay
    gT,              # [NC, H, K] fp32
    b,               # [BT, H] fp32
    dMqk, dL,        # [NC, H, C, C] fp32 (from chunk_bwd_dqkg_v_kernel)
    dOS, dcS, dkr,   # [BT, H, K] fp32 (idem)
    dgTs,            # [NC, H, K] fp32 (idem)
    dbv,             # [BT, H] fp32 (idem)
    g,               # [BT, H, K] raw gate, any float dtype
    A_log, dt_bias,  # [H], [H, K] fp32 (gate modes lower_bound / softplus)
    dq, dk,          # [BT, H, K] out: dqn, dkn (w.r.t. the normalised q, k; fp32 or the caller's dtype)
    dg,              # [BT, H, K] out: w.r.t. the raw gate (fp32 or the caller's dtype)
    db_part,         # [NK, BT, H] fp32 out: this K-block's share of db
    dA_part, ddt_part,  # [NC, H, K] fp32 out: per-chunk partials of dA_log (summed over K later), ddt_bias
    t_dkr, t_dqd, t_dkd, t_dki, t_dgT, t_dgc,  # tap buffers
    head_slot, tap_lo, tap_hi, n_sel,  # tap plan
    chunk_start, chunk_len,  # [NC] int32
    scale, lower_bound,  # floats
    c0,              # first chunk of this launch (common.chunk_launches)
    BT, H, K,        # sizes
    C: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr, GATE: tl.constexpr,
    TAP_DKR: tl.constexpr, TAP_DQD: tl.constexpr, TAP_DKD: tl.constexpr, TAP_DKI: tl.constexpr,
    TAP_DGT: tl.constexpr, TAP_DGC: tl.constexpr,
    SPLIT: tl.constexpr = 3,     # bf16 modes: tf32 MMAs per gate-sensitive product (mm_x3)
    BLOCKED: tl.constexpr = 1,   # 1: [C, 16] x [16, BK] block products; 0: [C, C] x [C, BK] with masks (fp32)
    SCAN: tl.constexpr = 0,      # row_sums' mode: DOT, or 0 for the fixed-order product (fp32; padded K blocks)
    RS: tl.constexpr = 0,        # qn, kn from the raw q, k and the row scales (prepare.qk_rowscale)
    LOOP_STAGES: tl.constexpr = 1,  # pipeline stages of the P and Q block loops (knob DQKG_LOOP_STAGES)
    PREFETCH: tl.constexpr = 0,  # 1: the rows read after the block loops asked into L2 first (DQKG_PREFETCH)
    HEADS_FIRST: tl.constexpr = 0,  # 1: a 1-D grid, one chunk's heads adjacent (common.chunk_grid; same bits)
):
    if HEADS_FIRST:
        i_c, i_h, i_k = chunk_head_block(c0, H, tl.cdiv(K, BK))
    else:
        i_k, i_c, i_h = tl.program_id(0), tl.program_id(1) + c0, tl.program_id(2)
    ANY_TAP: tl.constexpr = TAP_DKR or TAP_DQD or TAP_DKD or TAP_DKI or TAP_DGT or TAP_DGC
    if ANY_TAP:  # the head's tap slot, loaded once: each tap's index is formed from it at its store
        slot = tl.load(head_slot + i_h)
    else:
        slot = -1
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)
    first = i_k == 0
    o_t = tl.arange(0, C)
    o_k = i_k * BK + tl.arange(0, BK)
    m_t, m_k = o_t < n, o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    o_ch = (i_c * H + i_h).to(tl.int64)
    o_tk = ((bos + o_t[:, None]) * H + i_h) * K + o_k[None, :]
    if PREFETCH:  # the V pass's rows and the raw gate, read after the loops: their lines in L2 by then
        o_line = ((bos + tl.minimum(o_t, n - 1)) * H + i_h) * K + i_k * BK  # a row's K block: one line
        prefetch_l2(dOS + o_line)
        prefetch_l2(dcS + o_line)
        prefetch_l2(dkr + o_line)
        if GATE != 0:
            prefetch_l2(g + o_line)

    b_b = tl.load(b + (bos + o_t) * H + i_h, mask=m_t, other=0.)
    b_gT = tl.load(gT + o_ch * K + o_k, mask=m_k, other=0.)
    b_gc = tl.load(gc + o_tk, mask=m_tk, other=0.)
    b_gc = tl.where(m_t[:, None], b_gc, b_gT[None, :])  # padding rows carry the chunk total
    b_qn = load_qk(qn, o_tk, m_tk, rq, (bos + o_t) * H + i_h, m_t, RS)
    b_kn = load_qk(kn, o_tk, m_tk, rk, (bos + o_t) * H + i_h, m_t, RS)
    b_E = exp_(b_gc, DOT == 0)

    # intra-chunk products with the decay exp(gc_i - gc_j), j <= i, on 16-row blocks:
    # P·[i] = sum_j A[i,j] x_j e^(gc_i-gc_j) by column blocks J;  Q·[j] = sum_i A[i,j] y_i e^(gc_i-gc_j) by
    # row blocks I. Each block is a [C, 16] x [16, BK] product with A's block read from memory (L2), so
    # no [C, C] tile stays live. The diagonal of dMqk is applied exactly, outside: its dgc terms cancel
    # (qn dMqk_ii kn - kn dMqk_ii qn). Two passes (P, then Q) so that fewer tiles are live at once.
    o_cc0 = o_ch * C * C
    b_dd = tl.load(dMqk + o_cc0 + o_t * (C + 1))
    # taps dqd, dkd: T = dMqk ki and dL ki, stored before the Q loop so that T is not live through it
    TAP_T: tl.constexpr = TAP_DQD or TAP_DKD
    b_Pq = tl.zeros([C, BK], dtype=tl.float32)
    b_Pl = tl.zeros([C, BK], dtype=tl.float32)
    b_Tq = tl.zeros([C, BK], dtype=tl.float32)
    b_Tl = tl.zeros([C, BK], dtype=tl.float32)
    if BLOCKED:
        for J in tl.range(0, C // 16, num_stages=LOOP_STAGES):  # not unrolled: bounds the live tiles
            d_q, d_l = _p_block(J, o_t, b_gc, b_gT, kn, rk, gc, dMqk, dL, o_cc0, bos, n, i_h, o_k, m_k, H, K, C,
                                DOT, SPLIT, RS)
            b_Pq += d_q
            b_Pl += d_l
    else:
        o_cc = o_cc0 + o_t[:, None] * C + o_t[None, :]
        b_dMs = tl.where(o_t[:, None] > o_t[None, :], tl.load(dMqk + o_cc), 0.)
        b_dL = tl.load(dL + o_cc)
        for I in tl.range(0, C // 16, num_stages=LOOP_STAGES):
            d_q, d_l, t_q, t_l = _p_rows_full(I, o_t, b_gc, b_kn, b_dd, b_dMs, b_dL, DOT, SPLIT, TAP_T)
            b_Pq += d_q
            b_Pl += d_l
            if TAP_T:
                b_Tq += t_q
                b_Tl += t_l
    if TAP_T:
        idx, on = slot_index(i_c, slot, tap_lo, tap_hi, n_sel)
        if on:
            if BLOCKED:  # T = e^(-gc) (P + dMqk's diagonal term), e^(-gc) applied as two halves (_unscale)
                b_Tq = _unscale(b_Pq + b_dd[:, None] * b_kn, b_gc, DOT == 0)
                b_Tl = _unscale(b_Pl, b_gc, DOT == 0)
            if TAP_DQD:  # dO S^T + dMqk ki
                _store_tap(t_dqd, idx, tl.load(dOS + o_tk, mask=m_tk, other=0.) + b_Tq, o_t, o_k, m_k, K, C)
            if TAP_DKD:  # b (dL ki - dvcorr S^T)
                _store_tap(t_dkd, idx, b_b[:, None] * (b_Tl - tl.load(dcS + o_tk, mask=m_tk, other=0.)), o_t, o_k,
                           m_k, K, C)
    b_Eq = b_E * tl.load(dOS + o_tk, mask=m_tk, other=0.) + b_Pq   # E⊙dqd without the dMqk diagonal
    store_rn(dq + o_tk, scale * (b_Eq + b_dd[:, None] * b_kn), m_tk)
    b_dgx = scale * b_qn * b_Eq                                   # dgc without the kr path (q part)
    b_X = b_Pl - b_E * tl.load(dcS + o_tk, mask=m_tk, other=0.)    # E⊙dkd / b
    b_db = tl.sum(b_kn * b_X, axis=1)
    if first:
        b_db += tl.load(dbv + (bos + o_t) * H + i_h, mask=m_t, other=0.)
    tl.store(db_part + (i_k * BT + bos + o_t) * H + i_h, b_db, mask=m_t)
    b_Ed = b_b[:, None] * b_X                                     # E⊙dkd

    b_Qq = tl.zeros([C, BK], dtype=tl.float32)
    b_Ql = tl.zeros([C, BK], dtype=tl.float32)
    if BLOCKED:
        for I in tl.range(0, C // 16, num_stages=LOOP_STAGES):
            d_q, d_l = _q_block(I, o_t, b_gc, b_gT, qn, kn, rq, rk, gc, b, dMqk, dL, o_cc0, bos, n, i_h, o_k, m_k,
                                H, K, C, DOT, SPLIT, RS)
            b_Qq += d_q
            b_Ql += d_l
    else:
        b_dbL = b_b[:, None] * b_dL
        for I in tl.range(0, C // 16, num_stages=LOOP_STAGES):
            d_q, d_l = _q_rows_full(I, o_t, b_gc, b_qn, b_kn, b_dMs, b_dbL, DOT, SPLIT)
            b_Qq += d_q
            b_Ql += d_l

    b_Ei = scale * b_Qq + b_Ql                    # E⁻⊙dki without the dMqk diagonal
    idx, on = slot_index(i_c, slot, tap_lo, tap_hi, n_sel)  # again: not live from above
    if TAP_DKI and on:  # E from gc masked as its load was (0 on padding rows): not the E formed first,
        # which would then stay live through the Q loop; a reload of gc waited on memory
        b_Et = exp_(tl.where(m_tk, b_gc, 0.), DOT == 0)
        _store_tap(t_dki, idx, (b_Ei + scale * b_dd[:, None] * b_qn) * b_Et, o_t, o_k, m_k, K, C)
    b_dkrv = tl.load(dkr + o_tk, mask=m_tk, other=0.)
    idx, on = slot_index(i_c, slot, tap_lo, tap_hi, n_sel)  # again: not live from above
    if TAP_DKR and on:
        _store_tap(t_dkr, idx, b_dkrv, o_t, o_k, m_k, K, C)
    b_Rr = exp_(b_gT[None, :] - b_gc, DOT == 0) * b_dkrv  # R⊙dkr
    store_rn(dk + o_tk, b_Ed + b_Ei + scale * b_dd[:, None] * b_qn + b_Rr, m_tk)
    b_dgx += b_kn * (b_Ed - b_Ei)                 # dgc without the kr path
    b_dkrr = b_kn * b_Rr                          # kr⊙dkr
    idx, on = slot_index(i_c, slot, tap_lo, tap_hi, n_sel)  # again: not live from above
    if TAP_DGC and on:
        _store_tap(t_dgc, idx, b_dgx - b_dkrr, o_t, o_k, m_k, K, C)

    # dγ[i] = sum_{r >= i} dgc[r] + dgT with dgT = eT⊙rowsum(dS⁺⊙S) + sum_r kr⊙dkr[r]; the kr path
    # enters dgc[r] as -kr⊙dkr[r], so it is summed as the prefix r < i rather than total - suffix
    b_dgTs = tl.load(dgTs + o_ch * K + o_k, mask=m_k, other=0.)
    b_sx = row_sums(b_dgx, o_t, 1, SCAN)
    b_dkrs = row_sums(b_dkrr, o_t, 0, SCAN)
    b_dgam = b_sx + b_dkrs + (exp_(b_gT, DOT == 0) * b_dgTs)[None, :]
    if TAP_DGT and SCAN != 0:
        # sum_r kr⊙dkr[r] as the scan's last row plus that row (0 on padding rows), stored from the threads
        # that hold the row: no reduction of its own, and kr⊙dkr is not live past the scan. Not with the
        # fixed-order product (SCAN 0): a second use of its result kept Triton from folding the add that
        # follows into the product's accumulator, and dg changed in its last bits
        idx, on = slot_index(i_c, slot, tap_lo, tap_hi, n_sel)
        if on:
            _store_last_row(t_dgT + idx * K + o_k[None, :] + 0 * o_t[:, None],
                            (exp_(b_gT, DOT == 0) * b_dgTs)[None, :] + (b_dkrs + b_dkrr), o_t, m_k, C)
    b_dgam = tl.where(m_tk, b_dgam, 0.)
    if GATE == 0:
        b_dg = b_dgam
    else:
        b_graw = tl.load(g + o_tk, mask=m_tk, other=0.).to(tl.float32)
        b_dt = tl.load(dt_bias + i_h * K + o_k, mask=m_k, other=0.)
        b_A = exp_(tl.load(A_log + i_h), DOT == 0)
        if GATE == 1:
            b_z = b_A * (b_graw + b_dt[None, :])
            b_dz = div_(b_dgam * lower_bound, (1. + exp_(-b_z, DOT == 0)) * (1. + exp_(b_z, DOT == 0)), DOT == 0)
            b_dg = b_A * b_dz
            b_dA = tl.sum(tl.where(m_tk, b_dz * b_z, 0.), axis=0)
        else:
            b_x = b_graw + b_dt[None, :]
            b_s = div_(1., 1. + exp_(-b_x, DOT == 0), DOT == 0)
            b_sp = tl.where(b_x > 20., b_x, log_(1. + exp_(tl.minimum(b_x, 20.), DOT == 0), DOT == 0))
            b_dg = -b_A * b_s * b_dgam
            b_dA = tl.sum(tl.where(m_tk, -b_A * b_sp * b_dgam, 0.), axis=0)
        b_dg = tl.where(m_tk, b_dg, 0.)
        tl.store(dA_part + o_ch * K + o_k, b_dA, mask=m_k)
        tl.store(ddt_part + o_ch * K + o_k, tl.sum(b_dg, axis=0), mask=m_k)
    store_rn(dg + o_tk, b_dg, m_tk)

    if TAP_DGT and SCAN == 0:
        idx, on = slot_index(i_c, slot, tap_lo, tap_hi, n_sel)
        if on:  # last: the tap-only reduction follows the taps-off code's (layout_check.py)
            tl.store(t_dgT + idx * K + o_k, exp_(b_gT, DOT == 0) * b_dgTs + tl.sum(b_dkrr, axis=0), mask=m_k)


@triton.jit
def _x_dx_block(x, dx, o_th, m_t, K, i_k, BK: tl.constexpr):
    """K block ``i_k`` of the rows ``o_th``: ``x`` (as fp32) and ``dx``, with their offsets and mask."""
    o_k = i_k * BK + tl.arange(0, BK)
    m_tk = m_t[:, None] & (o_k < K)[None, :]
    o_tk = o_th[:, None] * K + o_k[None, :]
    return tl.load(x + o_tk, mask=m_tk, other=0.).to(tl.float32), tl.load(dx + o_tk, mask=m_tk, other=0.), o_tk, m_tk


@triton.jit
def l2norm_bwd_rows(x, dx, dx_out, o_th, m_t, K, C: tl.constexpr, BK: tl.constexpr, ONE: tl.constexpr,
                    PRECISE: tl.constexpr):
    """``dx_out`` rows from ``dx`` (fp32) rows: r (dxn - xn <dxn, xn>) = r dxn - r^3 x <dxn, x>,
    r = (|x|^2 + 1e-6)^-1/2 (``dx_out`` may be ``dx`` itself). ``ONE`` (``BK >= K``): the rows read once and
    kept in registers; else twice, a K block at a time (the sums, then the output)."""
    if ONE:
        b_x, b_dx, o_tk, m_tk = _x_dx_block(x, dx, o_th, m_t, K, 0, BK)
        b_r = rsqrt_(tl.sum(b_x * b_x, axis=1) + 1e-6, PRECISE)
        b_c = b_r * b_r * b_r * tl.sum(b_x * b_dx, axis=1)
        store_rn(dx_out + o_tk, b_r[:, None] * b_dx - b_c[:, None] * b_x, m_tk)
    else:
        b_ss = tl.zeros([C], dtype=tl.float32)
        b_sd = tl.zeros([C], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            b_x, b_dx, o_tk, m_tk = _x_dx_block(x, dx, o_th, m_t, K, i_k, BK)
            b_ss += tl.sum(b_x * b_x, axis=1)
            b_sd += tl.sum(b_x * b_dx, axis=1)
        b_r = rsqrt_(b_ss + 1e-6, PRECISE)
        b_c = b_r * b_r * b_r * b_sd
        for i_k in range(tl.cdiv(K, BK)):
            b_x, b_dx, o_tk, m_tk = _x_dx_block(x, dx, o_th, m_t, K, i_k, BK)
            store_rn(dx_out + o_tk, b_r[:, None] * b_dx - b_c[:, None] * b_x, m_tk)


@triton.jit
def chunk_bwd_finish_kernel(
    q, k,            # [BT, H, K] raw inputs, any float dtype
    dqn, dkn,        # [BT, H, K] fp32 in (when L2NORM)
    dq, dk,          # [BT, H, K] out (when L2NORM): fp32 or the caller's dtype; may be dqn, dkn themselves
    beta,            # [BT, H] raw beta, any float dtype
    db_part,         # [NK, BT, H] fp32
    dbeta,           # [BT, H] out (fp32 or the caller's dtype)
    t_db,            # [hi-lo, n_sel, C] tap buffer
    head_slot, tap_lo, tap_hi, n_sel,  # tap plan
    chunk_start, chunk_len,  # [NC] int32
    BT, H, K, NK,    # sizes
    C: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr, BETA_SIGMOID: tl.constexpr,
    TAP_DB: tl.constexpr,
    ONE: tl.constexpr,           # BK >= K: the l2norm backward reads each row once (l2norm_bwd_rows)
    PRECISE: tl.constexpr,       # fp32 mode: IEEE division and sqrt, libdevice exp (tlmath.exp_)
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
    o_th = (bos + o_t) * H + i_h
    if L2NORM:
        l2norm_bwd_rows(q, dqn, dq, o_th, m_t, K, C, BK, ONE, PRECISE)
        l2norm_bwd_rows(k, dkn, dk, o_th, m_t, K, C, BK, ONE, PRECISE)
    b_db = tl.zeros([C], dtype=tl.float32)
    for i_k in range(NK):
        b_db += tl.load(db_part + i_k * BT * H + o_th, mask=m_t, other=0.)
    if TAP_DB:
        idx, on = tap_index(i_c, i_h, tap_lo, tap_hi, head_slot, n_sel)
        if on:
            tl.store(t_db + idx * C + o_t, b_db)
    if BETA_SIGMOID:
        b_x = tl.load(beta + o_th, mask=m_t, other=0.).to(tl.float32)
        b_db = div_(b_db, (1. + exp_(-b_x, PRECISE)) * (1. + exp_(b_x, PRECISE)), PRECISE)  # σ(x) σ(-x)
    store_rn(dbeta + o_th, b_db, m_t)


def _plan_args(tap_plan, chunks) -> dict:
    """The tap plan's kernel arguments (``head_slot, tap_lo, tap_hi, n_sel``); without a plan, nothing to
    store (``head_slot`` is then any int32 pointer: it is never read)."""
    if tap_plan is None:
        return dict(head_slot=chunks.chunk_len, tap_lo=0, tap_hi=0, n_sel=0)
    return dict(head_slot=tap_plan.head_slot, tap_lo=tap_plan.lo, tap_hi=tap_plan.hi, n_sel=tap_plan.n_sel)


def chunk_bwd_dqkg(qn, kn, gc, gT, b, INV, S, dSn, U, dU, v, do, g, A_log, dt_bias, chunks, *, scale: float,
                   gate: str, lower_bound: float, precision: str = "fp32", tap_plan=None, out_dtypes=None,
                   rq=None, rk=None):
    """Per-chunk backward. All tensors token-major on the flattened ``B*T`` axis; ``rq, rk``: the
    l2norm's row scales when ``qn, kn`` are the raw q, k (``prepare.qk_rowscale``).

    Two kernels over (K-blocks, chunks, heads): the V pass (products with S, dS⁺, U, dU; dv, dMqk, dL)
    and the K pass (everything else); the V pass's results go through global memory (fp32).

    Returns ``dqn, dkn`` [BT,H,K], ``dv`` [BT,H,V], ``dg`` [BT,H,K] (in ``out_dtypes``, default fp32),
    ``db_part`` [NK,BT,H] and, for the gates with parameters, ``dA_part, ddt_part`` [NC,H,K] (sum over
    chunks, and K for dA_log), fp32.
    """
    BT, H, K = qn.shape
    V = v.shape[-1]
    C, NC = chunks.chunk_size, chunks.n_chunks
    dev = qn.device
    BK = block_size(K, hi=64)
    BK3 = knob("DQKG_BK", block_size(K, hi=32))
    NK = cdiv(K, BK3)
    f32 = dict(device=dev, dtype=torch.float32)
    t_q, t_k, t_v, t_g = out_dtypes or (torch.float32,) * 4
    dqn, dkn, dg = (torch.empty(BT, H, K, device=dev, dtype=t) for t in (t_q, t_k, t_g))
    dv = torch.empty(BT, H, V, device=dev, dtype=t_v)
    db_part = torch.empty(NK, BT, H, **f32)
    has_params = gate != "none"
    dA_part = torch.empty(NC, H, K, **f32) if has_params else None
    ddt_part = torch.empty(NC, H, K, **f32) if has_params else None
    if NC == 0:
        return dqn, dkn, dv, dg, db_part, dA_part, ddt_part
    dMqk, dL = (torch.empty(NC, H, C, C, **f32) for _ in range(2))
    dOS, dcS, dkr = (torch.empty(BT, H, K, **f32) for _ in range(3))
    dgTs = torch.empty(NC, H, K, **f32)
    dbv = torch.empty(BT, H, **f32)
    if tap_plan is not None:
        tap_plan.alias(chunks, dMqk=dMqk, dL=dL, dkr=dkr)
    taps = {name: tap_plan is not None and tap_plan.has(name) for name in DQKG_TAPS}
    bufs = {name: tap_plan.get(name) if taps[name] else dv for name in DQKG_TAPS}
    # the tap plan's unfilled buffers (STATE_FILL_TAPS) are NaN-filled by the backward state pass before
    # this; where that pass did not take them (a caller of this stage alone), here, before any kernel writes
    if tap_plan is not None:
        tap_plan.fill_unfilled()
    plan = _plan_args(tap_plan, chunks)
    DOT = dot_mode(precision)
    blocked = knob("DQKG_BLOCKED", 0 if DOT == 0 else 1)
    # the block loops' loads pipelined where the blocks are many (4 at chunk 64): the next blocks' rows of
    # kn, qn, gc, dMqk and dL are in flight while one block's products run (the K pass is bound by load
    # latency: 2 programs per SM at 255 registers); the same bits (a launch choice)
    loop_stages = knob("DQKG_LOOP_STAGES", {64: 3, 32: 2}.get(C, 1) if blocked else 1)
    # the V pass's V tile: 64 columns in bf16 mode at chunk 64 (fewer, wider steps: 1.675 -> 1.585 ms at
    # H32 T16384 on the H200, though it spills), else up to 32 (fp32 mode's ieee products at 64 spill 15 KB)
    bv = knob("DQKGV_BV", block_size(V, hi=64 if DOT != 0 and C == 64 else 32))
    # heads first (common.chunk_grid) for the V pass, not the K pass: at lower-bound H32 T16384 on an H100 the V
    # pass 1.349 -> 1.332 ms, the K pass 2.940 -> 3.003 (pre-gated 2.672 -> 2.773; H64 T8192 2.970 -> 2.992;
    # docs/gpu/round54/call2)
    hf, hf_k = heads_first(), knob("DQKG_HEADS_FIRST", 0) != 0
    for c0, c1, in_window in chunk_launches(tap_plan, NC):
        on = {name: in_window and taps[name] for name in DQKG_TAPS}
        chunk_bwd_dqkg_v_kernel[chunk_grid(c1 - c0, H, cdiv(K, BK), first=hf, grid=(cdiv(K, BK), c1 - c0, H))](
            b=b, INV=INV, S=S, dSn=dSn, U=U, dU=dU, v=v, do=do, dv=dv, dMqk=dMqk, dL=dL, dOS=dOS, dcS=dcS,
            dkr=dkr, dgTs=dgTs, dbv=dbv, **{f"t_{n}": bufs[n] for n in V_TAPS}, **plan,
            chunk_start=chunks.chunk_start, chunk_len=chunks.chunk_len, c0=c0,
            H=H, K=K, V=V, C=C, BK=BK, BV=bv, DOT=DOT,
            **{f"TAP_{name.upper()}": on[name] for name in V_TAPS},
            # fp32 mode: on the H200 (Triton 3.6) the ieee products under `if first` in this pipelined loop
            # came out wrong (dq, dk, dg); computed in every K-block they are right. bf16 mode keeps the
            # cheaper form, which passes the same GPU checks.
            UNCOND=knob("DQKGV_UNCOND", 1 if DOT == 0 else 0), HEADS_FIRST=hf, **LAUNCH,
            num_warps=knob("DQKGV_WARPS", 4 if C <= 16 else 8), num_stages=knob("DQKGV_STAGES", 3))
        chunk_bwd_dqkg_kernel[chunk_grid(c1 - c0, H, NK, first=hf_k, grid=(NK, c1 - c0, H))](
            qn=qn, kn=kn, rq=b if rq is None else rq, rk=b if rk is None else rk, gc=gc, gT=gT, b=b, dMqk=dMqk,
            dL=dL, dOS=dOS, dcS=dcS, dkr=dkr, dgTs=dgTs, dbv=dbv, g=g,
            A_log=A_log if has_params else dv, dt_bias=dt_bias if has_params else dv,
            dq=dqn, dk=dkn, dg=dg, db_part=db_part, dA_part=dA_part if has_params else dv,
            ddt_part=ddt_part if has_params else dv, **{f"t_{n}": bufs[n] for n in K_TAPS}, **plan,
            chunk_start=chunks.chunk_start, chunk_len=chunks.chunk_len, scale=scale, lower_bound=lower_bound,
            c0=c0, BT=BT, H=H, K=K, C=C, BK=BK3, DOT=DOT, GATE=GATE_IDS[gate],
            **{f"TAP_{name.upper()}": on[name] for name in K_TAPS}, SPLIT=knob("DQKG_SPLIT", 2 if C == 64 else 3),
            # blocks are faster in the bf16 modes; fp32 mode keeps the [C, C] products, more accurate in
            # ddt_bias on the H200 (both measured: docs/kernels.md)
            BLOCKED=blocked,
            # a K block with padding columns (K = 8 at chunks 32 and 64) moved the scan's register layout
            # with taps on (benchmarks/layout_check.py): there the fixed-order product, cheap at small K
            SCAN=0 if K % BK3 else DOT, RS=rq is not None, LOOP_STAGES=loop_stages,
            # the rows read after the block loops asked into L2 at the start: the K pass 3.355 -> 3.265 ms
            # lower-bound, 3.561 -> 3.464 softplus at H32 T16384 (docs/gpu/round34/call4)
            PREFETCH=knob("DQKG_PREFETCH", 1) if DOT != 0 else 0, HEADS_FIRST=hf_k, **LAUNCH,
            num_warps=knob("DQKG_WARPS", 4), num_stages=knob("DQKG_STAGES", 3),
            **reg_cap(knob("DQKG_MAXNREG", 0)))
    return dqn, dkn, dv, dg, db_part, dA_part, ddt_part


def chunk_bwd_finish(q, k, dqn, dkn, beta, db_part, chunks, *, qk_l2norm: bool, beta_sigmoid: bool, precision: str,
                     tap_plan=None, out_dtypes=None):
    """Returns ``dq, dk`` [BT,H,K] (the L2-norm backward of ``dqn, dkn`` when on, else ``dqn, dkn``
    themselves) and ``dbeta`` [BT,H], in ``out_dtypes`` (default fp32; in place when fp32)."""
    BT, H, K = q.shape
    t_q, t_k, t_b = out_dtypes or (torch.float32,) * 3
    dq, dk = dqn, dkn
    if qk_l2norm:
        dq, dk = (d if t == d.dtype else torch.empty_like(d, dtype=t) for d, t in ((dqn, t_q), (dkn, t_k)))
    dbeta = torch.empty(BT, H, device=q.device, dtype=t_b)
    if chunks.n_chunks == 0:
        return dq, dk, dbeta
    tap = tap_plan is not None and tap_plan.has("db")
    # the l2norm backward over all of K at once up to K = 128, at 8 warps: each row read once
    bk = knob("FINISH_BK", block_size(K, hi=128))
    hf = heads_first()
    chunk_bwd_finish_kernel[chunk_grid(chunks.n_chunks, H, first=hf, grid=(chunks.n_chunks, H))](
        q=q, k=k, dqn=dqn, dkn=dkn, dq=dq, dk=dk, beta=beta, db_part=db_part, dbeta=dbeta,
        t_db=tap_plan.get("db") if tap else dbeta, **_plan_args(tap_plan, chunks), chunk_start=chunks.chunk_start,
        chunk_len=chunks.chunk_len, BT=BT, H=H, K=K, NK=db_part.shape[0], C=chunks.chunk_size,
        BK=bk, L2NORM=qk_l2norm, BETA_SIGMOID=beta_sigmoid, TAP_DB=tap, ONE=bk >= K,
        PRECISE=precision == "fp32", HEADS_FIRST=hf, **LAUNCH, num_warps=knob("FINISH_WARPS", 8),
        num_stages=knob("FINISH_STAGES", 3))
    return dq, dk, dbeta
