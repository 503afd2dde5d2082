"""Forward stage 1, "prepare" (spec §4): everything that is parallel over chunks, in four kernels.

- ``kda_fwd_token_kernel`` (chunks, H): the per-token stage. l2norm, gate activation, beta
  activation, the within-chunk gate cumsum ``gc``, the total ``gT`` and ``krT``.
- ``kda_fwd_intra_kernel`` (chunks, H, 16-row blocks): the strictly lower
  ``L = Diag(b) strict_tril(kd ki^T)`` and ``Mqk = tril(qd ki^T)``, written into the ``INV`` buffer.
- ``kda_fwd_inv_kernel`` (chunks, H): ``INV = (I + L)^-1`` (16-row blocks, see the kernel), in
  place of ``L``.
- ``kda_fwd_wu_kernel`` (chunks, H, 2): the two WY-style products the recurrence needs,
  ``w = INV Diag(b) kd`` [C,K] and ``u = INV Diag(b) v`` [C,V], so that ``U = u - w S``.

Four kernels rather than one: each keeps under 170 registers on sm_90, so several programs share an
SM and hide each other's load latency. The fused kernel needed 255 (2 programs per SM), and its
serial chain of loads, substitution and products was the bound (docs/kernels.md has the timings).

``ki = kn exp(-gc)`` is never formed in the main path: it overflows fp32 at chunk 32/64 with
strong gates. ``kd ki^T`` and ``qd ki^T`` are built per 16-row block s of rows with the exponent
anchored at ``a = gc[16 s]``: ``exp(gc_i - a) <= 1`` on the block's rows and ``exp(a - gc_j) <=
exp(15 |gamma|max)`` on the columns ``j < 16 (s + 1)`` it pairs with; every other entry is selected
away with ``tl.where`` before the exponential.

The token and intra kernels walk K in blocks (the token kernel takes the row norms first when
l2norm is on), which keeps every tile small enough not to spill registers on sm_90.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import faults
from .common import LAUNCH, chunk_launches, tap_kernel_args
from .tuning import block_size, knob
from .tlmath import GATE_IDS, gate_act, mm_tf32, sigmoid

TOKEN_TAPS = ("gc", "gT", "b", "qd", "kd", "ki", "kr")


@triton.jit(do_not_specialize=["tap_lo", "tap_hi", "n_sel", "fault_chunk", "c0"])
def kda_fwd_token_kernel(
    q,               # [BT, H, K] raw query (any float dtype)
    k,               # [BT, H, K] raw key
    g,               # [BT, H, K] raw gate (or the log-decay itself when GATE == 0)
    beta,            # [BT, H] beta logits (or b itself when BETA_SIGMOID is off)
    A_log,           # [H] fp32 (GATE != 0)
    dt_bias,         # [H, K] fp32 (GATE != 0)
    qn,              # out [BT, H, K] fp32: q after l2norm (STORE_QK; else q itself, not written)
    kn,              # out [BT, H, K] fp32: k after l2norm (STORE_QK; else k itself, read by the w pass)
    gc,              # out [BT, H, K] fp32: inclusive within-chunk cumsum of gamma
    krT,             # out [NC, H, K, BC] fp32: (kn exp(gT - gc))^T per chunk (<= |kn|; 0 on padding rows)
    b,               # out [BT, H] fp32: b after activation
    gT,              # out [NC, H, K] fp32: chunk total of gamma
    chunk_start,     # [NC] int32: flattened token of row 0
    chunk_len,       # [NC] int32: valid rows
    scale,           # query scale
    lower_bound,     # lower bound of the GATE == 1 activation
    t_gc, t_gT, t_b, t_qd, t_kd, t_ki, t_kr,  # tap buffers [hi-lo, n_sel, *shape]
    head_slot,       # [H] int32: tap slot of each head, -1 if not tapped
    tap_lo,          # first tapped chunk
    tap_hi,          # one past the last tapped chunk
    n_sel,           # number of tapped heads
    fault_chunk,     # test-only (kdadbg_kernels.faults): the chunk a planted fault applies to
    c0,              # first chunk of this launch (common.chunk_launches)
    H: tl.constexpr,
    K: tl.constexpr,
    BC: tl.constexpr,            # chunk size: 16, 32 or 64
    BK: tl.constexpr,            # K block
    GATE: tl.constexpr,          # 0 none, 1 lower_bound, 2 softplus
    L2NORM: tl.constexpr,
    BETA_SIGMOID: tl.constexpr,
    STORE_QK: tl.constexpr,      # write qn, kn (with l2norm, or a planted fault that shifts the loads)
    STORE_TAPS: tl.constexpr,
    TAP_GC: tl.constexpr, TAP_GT: tl.constexpr, TAP_B: tl.constexpr, TAP_QD: tl.constexpr,
    TAP_KD: tl.constexpr, TAP_KI: tl.constexpr, TAP_KR: tl.constexpr,
    FAULT: tl.constexpr = 0,     # test-only planted fault (faults.py): 3 gate_padding, 6 varlen_offset
):
    i_c, i_h = tl.program_id(0) + c0, tl.program_id(1)
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n_valid = tl.load(chunk_len + i_c)

    o_t = tl.arange(0, BC)
    m_t = o_t < n_valid
    o_tok = bos + o_t
    o_ld, m_ld = o_tok, m_t  # where inputs are loaded from
    if FAULT == 6:  # test-only: inputs loaded one token late from the planted chunk on
        sh = tl.where((fault_chunk >= 0) & (i_c >= fault_chunk), 1, 0)
        o_ld, m_ld = o_tok + sh, o_t + sh < n_valid
    o_ch = (i_c * H + i_h).to(tl.int64)
    if GATE != 0:
        a_h = tl.exp(tl.load(A_log + i_h).to(tl.float32))
    else:
        a_h = 1.0
    i_slot = tl.load(head_slot + i_h) if STORE_TAPS else -1
    tapped = STORE_TAPS & (i_c >= tap_lo) & (i_c < tap_hi) & (i_slot >= 0)
    o_tap = ((i_c - tap_lo) * n_sel + i_slot).to(tl.int64)

    b_beta = tl.load(beta + o_ld * H + i_h, mask=m_ld, other=0).to(tl.float32)
    if BETA_SIGMOID:
        b_b = tl.where(m_t, sigmoid(b_beta), 0.0)
    else:
        b_b = b_beta

    # row norms over K, a K block at a time
    b_rq = tl.full([BC], 1.0, dtype=tl.float32)
    b_rk = tl.full([BC], 1.0, dtype=tl.float32)
    if L2NORM:
        b_sq = tl.zeros([BC], dtype=tl.float32)
        b_sk = tl.zeros([BC], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            o_ldk = (o_ld[:, None] * H + i_h) * K + o_k[None, :]
            m_ldk = m_ld[:, None] & (o_k < K)[None, :]
            b_q = tl.load(q + o_ldk, mask=m_ldk, other=0).to(tl.float32)
            b_k = tl.load(k + o_ldk, mask=m_ldk, other=0).to(tl.float32)
            b_sq += tl.sum(b_q * b_q, 1)
            b_sk += tl.sum(b_k * b_k, 1)
        b_rq = 1.0 / tl.sqrt(b_sq + 1e-6)
        b_rk = 1.0 / tl.sqrt(b_sk + 1e-6)

    # per K block: the per-token stage (qn, kn, gc, gT, kr)
    o_cK = o_t[:, None] * K
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        o_tk = (o_tok[:, None] * H + i_h) * K + o_k[None, :]
        o_ldk = (o_ld[:, None] * H + i_h) * K + o_k[None, :]
        m_ldk = m_ld[:, None] & m_k[None, :]
        b_q = tl.load(q + o_ldk, mask=m_ldk, other=0).to(tl.float32) * b_rq[:, None]
        b_k = tl.load(k + o_ldk, mask=m_ldk, other=0).to(tl.float32) * b_rk[:, None]
        b_g = tl.load(g + o_ldk, mask=m_ldk, other=0).to(tl.float32)
        if GATE != 0:
            b_dt = tl.load(dt_bias + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
        else:
            b_dt = tl.zeros([BK], dtype=tl.float32)
        # padding rows decay nothing, so gc stays flat past the last valid row
        b_gam = tl.where(m_tk, gate_act(b_g, b_dt, a_h, lower_bound, GATE), 0.0)
        if FAULT == 3:  # test-only: padding rows' decay left in the planted chunk, gT read at the tile's last row
            b_gam = tl.where((i_c == fault_chunk) & m_k[None, :], gate_act(b_g, b_dt, a_h, lower_bound, GATE),
                             b_gam)
        b_gc = tl.cumsum(b_gam, axis=0)
        b_gT = tl.sum(tl.where((o_t == n_valid - 1)[:, None], b_gc, 0.0), 0)
        if FAULT == 3:
            b_gT = tl.where(i_c == fault_chunk, tl.sum(tl.where((o_t == BC - 1)[:, None], b_gc, 0.0), 0), b_gT)
        b_kr = tl.where(m_tk, b_k * tl.exp(b_gT[None, :] - b_gc), 0.0)
        if STORE_QK:
            tl.store(qn + o_tk, b_q, mask=m_tk)
            tl.store(kn + o_tk, b_k, mask=m_tk)
        tl.store(gc + o_tk, b_gc, mask=m_tk)
        tl.store(krT + (o_ch * K + o_k[None, :]) * BC + o_t[:, None], b_kr, mask=m_k[None, :])
        tl.store(gT + o_ch * K + o_k, b_gT, mask=m_k)
        if tapped:
            o_ck = o_cK + o_k[None, :]
            m_ck = (o_t >= 0)[:, None] & m_k[None, :]
            if TAP_GC:
                tl.store(t_gc + o_tap * BC * K + o_ck, b_gc, mask=m_ck)
            if TAP_GT:
                tl.store(t_gT + o_tap * K + o_k, b_gT, mask=m_k)
            if TAP_QD:
                tl.store(t_qd + o_tap * BC * K + o_ck, b_q * scale * tl.exp(b_gc), mask=m_ck)
            if TAP_KD:
                tl.store(t_kd + o_tap * BC * K + o_ck, b_k * tl.exp(b_gc), mask=m_ck)
            if TAP_KI:
                # the definition itself: may be inf in fp32 at chunk 32/64 with strong gates
                tl.store(t_ki + o_tap * BC * K + o_ck, tl.where(b_k == 0, 0.0, b_k * tl.exp(-b_gc)), mask=m_ck)
            if TAP_KR:
                tl.store(t_kr + o_tap * BC * K + o_ck, b_kr, mask=m_ck)
    tl.store(b + o_tok * H + i_h, b_b, mask=m_t)
    if tapped:
        if TAP_B:
            tl.store(t_b + o_tap * BC + o_t, b_b)


@triton.jit(do_not_specialize=["tap_lo", "tap_hi", "n_sel", "c0"])
def kda_fwd_intra_kernel(
    qn,              # [BT, H, K]: queries after l2norm (or the raw queries)
    kn,              # [BT, H, K]: keys after l2norm (or the raw keys)
    gc,              # [BT, H, K] fp32
    b,               # [BT, H] fp32
    L,               # out [NC, H, BC, BC] fp32: Diag(b) strict_tril(kd ki^T)
    Mqk,             # out [NC, H, BC, BC] fp32: tril(qd ki^T) (0 on padding)
    chunk_start,     # [NC] int32
    chunk_len,       # [NC] int32
    scale,
    t_L, t_Mqk,      # tap buffers [hi-lo, n_sel, BC, BC]
    head_slot, tap_lo, tap_hi, n_sel,
    c0,              # first chunk of this launch (common.chunk_launches)
    H: tl.constexpr,
    K: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    BF16: tl.constexpr,          # tensor-core dot operands (fast mode) instead of ieee fp32
    STORE_TAPS: tl.constexpr, TAP_L: tl.constexpr, TAP_MQK: tl.constexpr,
    ABLATE: tl.constexpr = 0,    # timing only (tuning.py): 4 no products
):
    """Rows 16 s .. 16 s + 15 of ``L`` and ``Mqk`` for s = program_id(2). The exponent is anchored at
    ``a = gc[16 s]`` (at the last valid row when the block is all padding): ``exp(gc_i - a) <= 1`` on
    the rows, ``exp(a - gc_j) <= exp(15 |gamma|max)`` on the columns ``j < 16 (s + 1)``; every other
    entry is selected away before the exponential."""
    i_c, i_h, i_s = tl.program_id(0) + c0, tl.program_id(1), tl.program_id(2)
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n_valid = tl.load(chunk_len + i_c)
    o_ch = (i_c * H + i_h).to(tl.int64)
    o_t = tl.arange(0, BC)
    o_r = i_s * 16 + tl.arange(0, 16)
    m_r = o_r < n_valid
    m_c = (o_t < n_valid) & (o_t < i_s * 16 + 16)
    i_a = tl.minimum(i_s * 16, n_valid - 1)  # the anchor row (gc is flat past the last valid row)
    b_Akk = tl.zeros([16, BC], dtype=tl.float32)
    b_Aqk = tl.zeros([16, BC], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK) if (ABLATE & 4) == 0 else 0):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        o_rk = ((bos + o_r)[:, None] * H + i_h) * K + o_k[None, :]
        m_rk = m_r[:, None] & m_k[None, :]
        o_ck = ((bos + o_t)[:, None] * H + i_h) * K + o_k[None, :]
        m_ck = m_c[:, None] & m_k[None, :]
        b_a = tl.load(gc + ((bos + i_a) * H + i_h) * K + o_k, mask=m_k, other=0)
        b_el = tl.exp(tl.where(m_rk, tl.load(gc + o_rk, mask=m_rk, other=0) - b_a[None, :], 0.0))
        b_kj = tl.load(kn + o_ck, mask=m_ck, other=0).to(tl.float32) * tl.exp(
            tl.where(m_ck, b_a[None, :] - tl.load(gc + o_ck, mask=m_ck, other=0), 0.0))
        b_kjT = tl.trans(b_kj)
        b_Akk += mm_tf32(tl.load(kn + o_rk, mask=m_rk, other=0).to(tl.float32) * b_el, b_kjT, BF16)
        b_Aqk += mm_tf32(tl.load(qn + o_rk, mask=m_rk, other=0).to(tl.float32) * scale * b_el, b_kjT, BF16)
    b_b = tl.load(b + (bos + o_r) * H + i_h, mask=m_r, other=0)
    b_L = tl.where(o_r[:, None] > o_t[None, :], b_Akk, 0.0) * b_b[:, None]
    b_M = tl.where(o_r[:, None] >= o_t[None, :], b_Aqk, 0.0)
    o_cc = o_r[:, None] * BC + o_t[None, :]
    tl.store(L + o_ch * BC * BC + o_cc, b_L)
    tl.store(Mqk + o_ch * BC * BC + o_cc, b_M)
    if STORE_TAPS:
        i_slot = tl.load(head_slot + i_h)
        if (i_c >= tap_lo) & (i_c < tap_hi) & (i_slot >= 0):
            o_tap = ((i_c - tap_lo) * n_sel + i_slot).to(tl.int64) * BC * BC
            if TAP_L:
                tl.store(t_L + o_tap + o_cc, b_L)
            if TAP_MQK:
                tl.store(t_Mqk + o_tap + o_cc, b_M)


@triton.jit(do_not_specialize=["tap_lo", "tap_hi", "n_sel", "c0"])
def kda_fwd_inv_kernel(
    INV,             # in/out [NC, H, BC, BC] fp32: L on entry, (I + L)^-1 on return (identity on padding)
    chunk_len,       # [NC] int32: valid rows
    t_INV,           # tap buffer [hi-lo, n_sel, BC, BC]
    head_slot,       # [H] int32: tap slot of each head, -1 if not tapped
    tap_lo, tap_hi, n_sel,
    c0,              # first chunk of this launch (common.chunk_launches)
    H: tl.constexpr,
    BC: tl.constexpr,
    BF16: tl.constexpr,
    STORE_TAPS: tl.constexpr,
    ABLATE: tl.constexpr = 0,    # timing only: 1 no substitution, 2 no block series
):
    """INV = (I + L)^-1 by blocks of 16 rows: A = I + L = D + N with D block diagonal, N strictly
    block-lower; D^-1 by forward substitution in exact fp32, all blocks at once (the rows s of every
    block touch disjoint columns, so one reduction serves them all); then (I + X)^-1 D^-1, X = D^-1 N,
    as the finite series I - X + X^2 - X^3 (X^NB = 0), on tensor cores in fast mode."""
    i_c, i_h = tl.program_id(0) + c0, tl.program_id(1)
    n_valid = tl.load(chunk_len + i_c)
    o_ch = (i_c * H + i_h).to(tl.int64)
    o_t = tl.arange(0, BC)
    o_cc = o_t[:, None] * BC + o_t[None, :]
    b_L = tl.load(INV + o_ch * BC * BC + o_cc)
    o_bi = o_t // 16
    m_bd = o_bi[:, None] == o_bi[None, :]
    b_Lbd = tl.where(m_bd, b_L, 0.0)
    b_inv = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)
    for i_r in range(1, tl.minimum(n_valid, 16) if (ABLATE & 1) == 0 else 1):
        m_r = (o_t % 16 == i_r)[:, None]
        b_l = tl.sum(tl.where(m_r, b_Lbd, 0.0), 0)
        b_r = tl.sum(b_l[:, None] * b_inv, 0)
        b_inv = tl.where(m_r & m_bd, b_inv - b_r[None, :], b_inv)
    if BC >= 32 and (ABLATE & 2) == 0:
        b_X = mm_tf32(b_inv, tl.where(m_bd, 0.0, b_L), BF16)
        if BC == 32:
            b_inv = b_inv - mm_tf32(b_X, b_inv, BF16)
        else:
            b_X2 = mm_tf32(b_X, b_X, BF16)
            b_inv = b_inv + mm_tf32(b_X2 - b_X - mm_tf32(b_X, b_X2, BF16), b_inv, BF16)
    tl.store(INV + o_ch * BC * BC + o_cc, b_inv)
    if STORE_TAPS:
        i_slot = tl.load(head_slot + i_h)
        if (i_c >= tap_lo) & (i_c < tap_hi) & (i_slot >= 0):
            tl.store(t_INV + ((i_c - tap_lo) * n_sel + i_slot).to(tl.int64) * BC * BC + o_cc, b_inv)


@triton.jit(do_not_specialize=["fault_chunk"])
def kda_fwd_wu_kernel(
    v,               # [BT, H, V] value
    kn,              # [BT, H, K]: keys after l2norm (or the raw keys)
    gc,              # [BT, H, K] fp32
    b,               # [BT, H] fp32
    INV,             # [NC, H, BC, BC] fp32
    w,               # out [BT, H, K] fp32: INV Diag(b) kd
    u,               # out [BT, H, V] fp32: INV Diag(b) v
    chunk_start,     # [NC] int32
    chunk_len,       # [NC] int32
    fault_chunk,     # test-only: the chunk a planted fault applies to
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,            # column block of both products
    BF16: tl.constexpr,
    FAULT: tl.constexpr = 0,     # test-only: 6 varlen_offset (v loaded one token late)
):
    """The WY products, program 0 of axis 2 forms ``w = INV Diag(b) kd``, program 1 ``u = INV Diag(b) v``."""
    i_c, i_h, i_p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n_valid = tl.load(chunk_len + i_c)
    o_t = tl.arange(0, BC)
    m_t = o_t < n_valid
    o_tok = bos + o_t
    o_ch = (i_c * H + i_h).to(tl.int64)
    b_inv = tl.load(INV + o_ch * BC * BC + o_t[:, None] * BC + o_t[None, :])
    b_b = tl.load(b + o_tok * H + i_h, mask=m_t, other=0)
    if i_p == 0:
        for i_k in range(tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_tk = m_t[:, None] & (o_k < K)[None, :]
            o_tk = (o_tok[:, None] * H + i_h) * K + o_k[None, :]
            b_kd = tl.load(kn + o_tk, mask=m_tk, other=0).to(tl.float32) * tl.exp(
                tl.load(gc + o_tk, mask=m_tk, other=0))
            tl.store(w + o_tk, mm_tf32(b_inv, b_kd * b_b[:, None], BF16), mask=m_tk)
    else:
        o_ld, m_ld = o_tok, m_t
        if FAULT == 6:
            sh = tl.where((fault_chunk >= 0) & (i_c >= fault_chunk), 1, 0)
            o_ld, m_ld = o_tok + sh, o_t + sh < n_valid
        for i_v in range(tl.cdiv(V, BK)):
            o_v = i_v * BK + tl.arange(0, BK)
            m_v = (o_v < V)[None, :]
            b_v = tl.load(v + (o_ld[:, None] * H + i_h) * V + o_v[None, :], mask=m_ld[:, None] & m_v,
                          other=0).to(tl.float32)
            tl.store(u + (o_tok[:, None] * H + i_h) * V + o_v[None, :], mm_tf32(b_inv, b_v * b_b[:, None], BF16),
                     mask=m_t[:, None] & m_v)


def kda_fwd_prepare(q, k, v, g, beta, chunks, *, scale, gate, lower_bound, qk_l2norm, beta_sigmoid,
                    A_log, dt_bias, precision, tap_plan=None):
    """Stage 1 on flattened inputs (q, k, g [BT,H,K]; v [BT,H,V]; beta [BT,H]).

    Returns ``qn, kn, gc, w [BT,H,K]`` (fp32; without l2norm ``qn, kn`` are ``q, k`` themselves, in their
    own dtype: the same values, no copy); ``krT [NC,H,K,C]; b [BT,H]; u [BT,H,V]; gT [NC,H,K];
    INV, Mqk [NC,H,C,C]``.  ``krT`` is ``kn exp(gT - gc)`` transposed per chunk: the recurrence's
    ``kr^T U`` then reads its left operand with the reduction axis contiguous, as tf32 MMAs need.
    """
    BT, H, K = q.shape
    V = v.shape[-1]
    C, NC = chunks.chunk_size, chunks.n_chunks
    dev, f32 = q.device, torch.float32
    fault, fault_chunk = faults.args("gate_padding", "varlen_offset")
    store_qk = qk_l2norm or fault != 0
    qn, kn = (torch.empty(BT, H, K, device=dev, dtype=f32) for _ in range(2)) if store_qk else (q, k)
    gc, w = (torch.empty(BT, H, K, device=dev, dtype=f32) for _ in range(2))
    krT = torch.empty(NC, H, K, C, device=dev, dtype=f32)
    u = torch.empty(BT, H, V, device=dev, dtype=f32)
    b = torch.empty(BT, H, device=dev, dtype=f32)
    gT = torch.empty(NC, H, K, device=dev, dtype=f32)
    INV = torch.empty(NC, H, C, C, device=dev, dtype=f32)
    Mqk = torch.empty(NC, H, C, C, device=dev, dtype=f32)
    if NC == 0:
        return qn, kn, gc, krT, b, w, u, gT, INV, Mqk
    has_gate, bf16, ablate = GATE_IDS[gate] != 0, precision == "bf16", knob("PREP_ABLATE", 0)
    bufs, slot, lo, hi, n_sel, store, present = tap_kernel_args(tap_plan, TOKEN_TAPS, qn, chunks)
    for c0, c1, taps in chunk_launches(tap_plan, NC):
        on = {n: taps and present[n] for n in TOKEN_TAPS}
        kda_fwd_token_kernel[(c1 - c0, H)](
            q, k, g, beta, A_log if has_gate else qn, dt_bias if has_gate else qn,
            qn, kn, gc, krT, b, gT, chunks.chunk_start, chunks.chunk_len,
            float(scale), float(lower_bound), *bufs, slot, lo, hi, n_sel, fault_chunk, c0,
            H=H, K=K, BC=C, BK=knob("PREP_BK", block_size(K, 32)), GATE=GATE_IDS[gate],
            L2NORM=qk_l2norm, BETA_SIGMOID=beta_sigmoid, STORE_QK=store_qk,
            STORE_TAPS=store and taps, TAP_GC=on["gc"], TAP_GT=on["gT"], TAP_B=on["b"], TAP_QD=on["qd"],
            TAP_KD=on["kd"], TAP_KI=on["ki"], TAP_KR=on["kr"], FAULT=fault, **LAUNCH,
            num_warps=knob("PREP_WARPS", 4),
        )
    (t_L, t_M), slot, lo, hi, n_sel, store, present = tap_kernel_args(tap_plan, ("L", "Mqk"), qn, chunks)
    for c0, c1, taps in chunk_launches(tap_plan, NC):
        kda_fwd_intra_kernel[(c1 - c0, H, C // 16)](
            qn, kn, gc, b, INV, Mqk, chunks.chunk_start, chunks.chunk_len, float(scale), t_L, t_M,
            slot, lo, hi, n_sel, c0, H=H, K=K, BC=C, BK=knob("PREP_INTRA_BK", block_size(K, 32)),
            BF16=bf16, STORE_TAPS=store and taps, TAP_L=taps and present["L"], TAP_MQK=taps and present["Mqk"],
            ABLATE=ablate & 4, **LAUNCH, num_warps=knob("PREP_INTRA_WARPS", 2),
        )
    (t_inv,), slot, lo, hi, n_sel, store, _ = tap_kernel_args(tap_plan, ("INV",), qn, chunks)
    for c0, c1, taps in chunk_launches(tap_plan, NC):
        kda_fwd_inv_kernel[(c1 - c0, H)](
            INV, chunks.chunk_len, t_inv, slot, lo, hi, n_sel, c0, H=H, BC=C, BF16=bf16,
            STORE_TAPS=store and taps, ABLATE=ablate & 3, **LAUNCH, num_warps=knob("PREP_INV_WARPS", 4),
        )
    if not ablate & 8:
        kda_fwd_wu_kernel[(NC, H, 2)](
            v, kn, gc, b, INV, w, u, chunks.chunk_start, chunks.chunk_len, fault_chunk, H=H, K=K, V=V, BC=C,
            BK=knob("PREP_WU_BK", block_size(max(K, V), 64)), BF16=bf16,
            FAULT=fault if fault == 6 else 0, **LAUNCH, num_warps=knob("PREP_WU_WARPS", 4),
        )
    return qn, kn, gc, krT, b, w, u, gT, INV, Mqk
