"""Forward stage 1, "prepare" (spec §4): everything that is parallel over chunks, in three kernels.

- ``kda_fwd_token_kernel`` (chunks, H): the per-token stage. l2norm, gate activation, beta activation, the
  within-chunk gate cumsum ``gc``, the total ``gT`` and ``krT``.
- ``kda_fwd_intra_solve_kernel`` (chunks, H): on [16, 16] blocks, the strictly lower
  ``L = Diag(b) strict_tril(kd ki^T)``, ``Mqk = tril(qd ki^T)`` and ``INV = (I + L)^-1``.
- ``kda_fwd_wu_kernel`` (chunks, H): the two WY-style products the recurrence needs,
  ``w = INV Diag(b) kd`` [C,K] and ``u = INV Diag(b) v`` [C,V], so that ``U = u - w S``.

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

from .common import LAUNCH, chunk_grid, chunk_launches, fwd_lowp, heads_first, rowscale_mode, tap_kernel_args
from .tuning import KnobError, block_size, cdiv, knob, reg_cap
from .tlmath import GATE_IDS, chunk_head_block, exp_, gate_act, load_qk, mm_tf32, round_qk, rsqrt_, sigmoid, store_rn

TOKEN_TAPS = ("gc", "gT", "b", "qd", "kd", "ki", "kr")


@triton.jit(do_not_specialize=["tap_lo", "tap_hi", "n_sel", "c0"])
def kda_fwd_token_kernel(
    q,               # [BT, H, K] raw query (any float dtype)
    k,               # [BT, H, K] raw key
    g,               # [BT, H, K] raw gate (or the log-decay itself when GATE == 0)
    beta,            # [BT, H] beta logits (or b itself when BETA_SIGMOID is off)
    A_log,           # [H] fp32 (GATE != 0)
    dt_bias,         # [H, K] fp32 (GATE != 0)
    qn,              # out [BT, H, K] fp32, fp16 or bf16 (QK_LOWP): q after l2norm (STORE_QK; else q itself)
    kn,              # out [BT, H, K] fp32, fp16 or bf16 (QK_LOWP): k after l2norm (STORE_QK; else k itself)
    rq, rk,          # out [BT, H] fp32 (STORE_RS): the l2norm's row scales 1 / sqrt(sum x^2 + 1e-6)
    gc,              # out [BT, H, K] fp32: inclusive within-chunk cumsum of gamma
    krT,             # out [NC, H, K, BC] fp32 (bf16 with FWD_LOWP & 2): (kn exp(gT - gc))^T per chunk
                     # (<= |kn|; 0 on padding rows)
    qd,              # out [BT, H, K] (STORE_QD): scale qn exp(gc), bf16 in bf16 mode, for the fused output
    kd,              # out [BT, H, K] bf16 (STORE_KD): kn exp(gc), for the state pass's U (chunk.fuse_wu)
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
    c0,              # first chunk of this launch (common.chunk_launches)
    H: tl.constexpr,
    K: tl.constexpr,
    BC: tl.constexpr,            # chunk size: 16, 32 or 64
    BK: tl.constexpr,            # K block
    GATE: tl.constexpr,          # 0 none, 1 lower_bound, 2 softplus
    L2NORM: tl.constexpr,
    BETA_SIGMOID: tl.constexpr,
    STORE_QK: tl.constexpr,      # write qn, kn (with l2norm, without row scales)
    STORE_RS: tl.constexpr,      # write rq, rk (with l2norm: qk_rowscale; the later kernels form qn, kn)
    QK_LOWP: tl.constexpr,       # qn, kn rounded before any use (qk_lowp_mode): 1 to bf16, 2 to fp16
    GC_F64: tl.constexpr,        # the gate and its cumsum in float64, rounded once (fp32 mode)
    PRECISE: tl.constexpr,       # fp32 mode: IEEE division and sqrt, libdevice exp (tlmath.exp_)
    STORE_QD: tl.constexpr,      # write qd (the state pass forms o: recurrence.FUSE_OUT)
    STORE_KD: tl.constexpr,      # write kd (the state pass forms U: chunk.fuse_wu)
    STORE_TAPS: tl.constexpr,
    TAP_GC: tl.constexpr, TAP_GT: tl.constexpr, TAP_B: tl.constexpr, TAP_QD: tl.constexpr,
    TAP_KD: tl.constexpr, TAP_KI: tl.constexpr, TAP_KR: tl.constexpr,
    UNROLL: tl.constexpr = 0,    # >0: the K-block loops unrolled by this factor (knob PREP_UNROLL; same bits)
    AHEAD: tl.constexpr = 0,     # 1: q, k, g of the next K block loaded one step ahead (knob PREP_AHEAD; same bits)
    HEADS_FIRST: tl.constexpr = 0,  # 1: a 1-D grid, one chunk's heads adjacent (common.chunk_grid; same bits)
    STORE_GC: tl.constexpr = 1,  # 0: gc not stored (no later kernel reads it: infer_gc_from_g)
):
    if HEADS_FIRST:
        i_c, i_h, _ = chunk_head_block(c0, H, 1)
    else:
        i_c, i_h = tl.program_id(0) + c0, tl.program_id(1)
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n_valid = tl.load(chunk_len + i_c)

    o_t = tl.arange(0, BC)
    m_t = o_t < n_valid
    o_tok = bos + o_t
    o_ch = (i_c * H + i_h).to(tl.int64)
    if GATE != 0:
        l_h = tl.load(A_log + i_h)
        a_h = exp_(l_h.to(tl.float32), PRECISE)
        a_h64 = tl.exp(l_h.to(tl.float64))
    else:
        a_h = 1.0
        a_h64 = 1.0
    i_slot = tl.load(head_slot + i_h) if STORE_TAPS else -1
    tapped = STORE_TAPS & (i_c >= tap_lo) & (i_c < tap_hi) & (i_slot >= 0)
    o_tap = ((i_c - tap_lo) * n_sel + i_slot).to(tl.int64)

    b_beta = tl.load(beta + o_tok * H + i_h, mask=m_t, other=0).to(tl.float32)
    if BETA_SIGMOID:
        b_b = tl.where(m_t, sigmoid(b_beta, PRECISE), 0.0)
    else:
        b_b = b_beta

    # row norms over K, a K block at a time
    b_rq = tl.full([BC], 1.0, dtype=tl.float32)
    b_rk = tl.full([BC], 1.0, dtype=tl.float32)
    if L2NORM:
        b_sq = tl.zeros([BC], dtype=tl.float32)
        b_sk = tl.zeros([BC], dtype=tl.float32)
        for i_k in tl.range(0, tl.cdiv(K, BK), loop_unroll_factor=UNROLL if UNROLL else None):
            o_k = i_k * BK + tl.arange(0, BK)
            o_tk = (o_tok[:, None] * H + i_h) * K + o_k[None, :]
            m_tk = m_t[:, None] & (o_k < K)[None, :]
            b_q = tl.load(q + o_tk, mask=m_tk, other=0).to(tl.float32)
            b_k = tl.load(k + o_tk, mask=m_tk, other=0).to(tl.float32)
            b_sq += tl.sum(b_q * b_q, 1)
            b_sk += tl.sum(b_k * b_k, 1)
        b_rq = rsqrt_(b_sq + 1e-6, PRECISE)
        b_rk = rsqrt_(b_sk + 1e-6, PRECISE)
        if STORE_RS:
            tl.store(rq + o_tok * H + i_h, b_rq, mask=m_t)
            tl.store(rk + o_tok * H + i_h, b_rk, mask=m_t)

    # per K block: the per-token stage (qn, kn, gc, gT, kr)
    o_cK = o_t[:, None] * K
    if AHEAD:  # block 0's raw q, k, g; each step then loads the next block's before its own work
        o_tk0 = (o_tok[:, None] * H + i_h) * K + tl.arange(0, BK)[None, :]
        m_tk0 = m_t[:, None] & (tl.arange(0, BK) < K)[None, :]
        n_q = tl.load(q + o_tk0, mask=m_tk0, other=0)
        n_k = tl.load(k + o_tk0, mask=m_tk0, other=0)
        n_g = tl.load(g + o_tk0, mask=m_tk0, other=0)
    for i_k in tl.range(0, tl.cdiv(K, BK), loop_unroll_factor=UNROLL if UNROLL else None):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        o_tk = (o_tok[:, None] * H + i_h) * K + o_k[None, :]
        if AHEAD:
            r_q, r_k, r_g = n_q, n_k, n_g
            m_next = m_t[:, None] & (o_k + BK < K)[None, :]
            n_q = tl.load(q + o_tk + BK, mask=m_next, other=0)
            n_k = tl.load(k + o_tk + BK, mask=m_next, other=0)
            n_g = tl.load(g + o_tk + BK, mask=m_next, other=0)
        else:
            r_q = tl.load(q + o_tk, mask=m_tk, other=0)
            r_k = tl.load(k + o_tk, mask=m_tk, other=0)
            r_g = tl.load(g + o_tk, mask=m_tk, other=0)
        # rounded as stored: every use below and in the later kernels reads the stored values
        b_q = round_qk(r_q.to(tl.float32) * b_rq[:, None], QK_LOWP)
        b_k = round_qk(r_k.to(tl.float32) * b_rk[:, None], QK_LOWP)
        b_g = r_g.to(tl.float32)
        if GATE != 0:
            b_dt = tl.load(dt_bias + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
        else:
            b_dt = tl.zeros([BK], dtype=tl.float32)
        # padding rows decay nothing, so gc stays flat past the last valid row
        if GC_F64:
            b_gam = tl.where(m_tk, gate_act(b_g.to(tl.float64), b_dt.to(tl.float64), a_h64, lower_bound, GATE), 0.0)
        else:
            b_gam = tl.where(m_tk, gate_act(b_g, b_dt, a_h, lower_bound, GATE, PRECISE), 0.0)
        b_gc = tl.cumsum(b_gam, axis=0).to(tl.float32)
        b_gT = tl.sum(tl.where((o_t == n_valid - 1)[:, None], b_gc, 0.0), 0)
        b_kr = tl.where(m_tk, b_k * exp_(b_gT[None, :] - b_gc, PRECISE), 0.0)
        if STORE_QK:
            tl.store(qn + o_tk, b_q, mask=m_tk)
            tl.store(kn + o_tk, b_k, mask=m_tk)
        if STORE_GC:
            tl.store(gc + o_tk, b_gc, mask=m_tk)
        store_rn(krT + (o_ch * K + o_k[None, :]) * BC + o_t[:, None], b_kr, m_k[None, :])
        tl.store(gT + o_ch * K + o_k, b_gT, mask=m_k)
        b_qd = b_q * scale * exp_(b_gc, PRECISE)  # the qd tap, and qd for the state pass's o (STORE_QD)
        b_kd = b_k * exp_(b_gc, PRECISE)  # the kd tap, and kd for the state pass's U (STORE_KD)
        if STORE_QD:
            store_rn(qd + o_tk, b_qd, m_tk)
        if STORE_KD:
            store_rn(kd + o_tk, b_kd, m_tk)
        if tapped:
            o_ck = o_cK + o_k[None, :]
            m_ck = (o_t >= 0)[:, None] & m_k[None, :]
            if TAP_GC:
                tl.store(t_gc + o_tap * BC * K + o_ck, b_gc, mask=m_ck)
            if TAP_GT:
                tl.store(t_gT + o_tap * K + o_k, b_gT, mask=m_k)
            if TAP_QD:
                tl.store(t_qd + o_tap * BC * K + o_ck, b_qd, mask=m_ck)
            if TAP_KD:
                tl.store(t_kd + o_tap * BC * K + o_ck, b_kd, mask=m_ck)
            if TAP_KI:
                # the definition itself: may be inf in fp32 at chunk 32/64 with strong gates
                tl.store(t_ki + o_tap * BC * K + o_ck, tl.where(b_k == 0, 0.0, b_k * exp_(-b_gc, PRECISE)), mask=m_ck)
            if TAP_KR:
                tl.store(t_kr + o_tap * BC * K + o_ck, b_kr, mask=m_ck)
    tl.store(b + o_tok * H + i_h, b_b, mask=m_t)
    if tapped:
        if TAP_B:
            tl.store(t_b + o_tap * BC + o_t, b_b)


@triton.jit
def _gc_block(g, b_dt, a_h, lower_bound, b_carry, bos, i_s, n_valid, i_h, o_k, m_k, H: tl.constexpr,
              K: tl.constexpr, GATE: tl.constexpr, PRECISE: tl.constexpr):
    """(``GC_FROM_G``) Row block s of ``gc``, one K block, formed from the raw gate as the token kernel forms
    it (``gate_act``; padding rows decay nothing, so gc stays flat past the last valid row), its within-block
    cumsum added to ``b_carry``, gc at the row before the block. Returns ``(gc [16, BK], a [BK], carry)``:
    the anchor ``a = gc[16 s]`` (the last valid row's gc when the block is all padding) and the carry for the
    next block, this block's last row."""
    o_r = i_s * 16 + tl.arange(0, 16)
    m = (o_r < n_valid)[:, None] & m_k[None, :]
    b_raw = tl.load(g + ((bos + o_r)[:, None] * H + i_h) * K + o_k[None, :], mask=m, other=0).to(tl.float32)
    b_gam = tl.where(m, gate_act(b_raw, b_dt, a_h, lower_bound, GATE, PRECISE), 0.0)
    b_gc = b_carry[None, :] + tl.cumsum(b_gam, axis=0)
    o = tl.arange(0, 16)[:, None]
    return b_gc, tl.sum(tl.where(o == 0, b_gc, 0.0), 0), tl.sum(tl.where(o == 15, b_gc, 0.0), 0)


@triton.jit
def _row_block(qn, kn, rq, rk, gc, bos, i_s, n_valid, i_h, o_k, m_k, scale, H: tl.constexpr, K: tl.constexpr,
               PRECISE: tl.constexpr, RS: tl.constexpr, b_carry, g=None, b_dt=None, a_h=1.0, lower_bound=0.0,
               GATE: tl.constexpr = 0, GCR: tl.constexpr = 0):
    """Row block s of a chunk, one K block: ``(kn, qn * scale) * exp(gc - a)`` with the anchor
    ``a = gc[16 s]`` (at the last valid row when the block is all padding), and the raw ``kn``, ``gc``
    for the blocks that pair with it as columns; last, the carry ``b_carry``. With ``GCR`` the block's gc
    and anchor are formed from the raw gate ``g`` after ``b_carry`` (``_gc_block``), not loaded, and the
    carry returned is this block's last row of gc; without, ``b_carry`` is returned as it came."""
    o_r = i_s * 16 + tl.arange(0, 16)
    m_r = o_r < n_valid
    m = m_r[:, None] & m_k[None, :]
    p = ((bos + o_r)[:, None] * H + i_h) * K + o_k[None, :]
    o_row = (bos + o_r) * H + i_h
    if GCR:
        b_g, b_a, b_carry = _gc_block(g, b_dt, a_h, lower_bound, b_carry, bos, i_s, n_valid, i_h, o_k, m_k, H, K,
                                      GATE, PRECISE)
    else:
        b_g = tl.load(gc + p, mask=m, other=0)
        b_a = tl.load(gc + ((bos + tl.minimum(i_s * 16, n_valid - 1)) * H + i_h) * K + o_k, mask=m_k, other=0)
    b_k = load_qk(kn, p, m, rk, o_row, m_r, RS)
    b_el = exp_(tl.where(m, b_g - b_a[None, :], 0.0), PRECISE)
    b_rk = b_k * b_el
    b_rq = load_qk(qn, p, m, rq, o_row, m_r, RS) * scale * b_el
    return b_rk, b_rq, b_a, b_k, b_g, m, b_carry


@triton.jit
def _pair(b_Akk, b_Aqk, b_rk, b_rq, b_a, b_kj, b_gj, m_j, BF16: tl.constexpr):
    """Accumulate rows s against the columns of block j <= s: ``kd ki^T`` and ``qd ki^T``, both
    anchored at the rows' ``a``."""
    b_c = tl.trans(tl.where(m_j, b_kj * exp_(tl.where(m_j, b_a[None, :] - b_gj, 0.0), BF16 == 0), 0.0))
    return b_Akk + mm_tf32(b_rk, b_c, BF16), b_Aqk + mm_tf32(b_rq, b_c, BF16)


@triton.jit
def _unit_lower_inv(b_L, n_rows):
    """(I + L)^-1 of one strictly lower [16, 16] block by forward substitution in exact fp32."""
    o = tl.arange(0, 16)
    b_inv = tl.where(o[:, None] == o[None, :], 1.0, 0.0)
    for i_r in range(1, n_rows):
        m_r = (o == i_r)[:, None]
        b_l = tl.sum(tl.where(m_r, b_L, 0.0), 0)
        b_r = tl.sum(b_l[:, None] * b_inv, 0)
        b_inv = tl.where(m_r, b_inv - b_r[None, :], b_inv)
    return b_inv


@triton.jit
def _store_lower(p, b00, b10, b11, b20, b21, b22, b30, b31, b32, b33, NB: tl.constexpr, BC: tl.constexpr):
    """A block-lower [BC, BC] matrix from its [16, 16] blocks (zeros above the block diagonal)."""
    o_t = tl.arange(0, BC)
    o = tl.arange(0, 16)
    tl.store(p + o_t[:, None] * BC + o_t[None, :], tl.zeros([BC, BC], dtype=tl.float32),
             mask=(o_t // 16)[:, None] < (o_t // 16)[None, :])
    o_b = o[:, None] * BC + o[None, :]
    store_rn(p + o_b, b00, None)  # to nearest even when p is bf16 (Mqk, mqk_bf16)
    if NB >= 2:
        store_rn(p + 16 * BC + o_b, b10, None)
        store_rn(p + 16 * BC + 16 + o_b, b11, None)
    if NB >= 4:
        store_rn(p + 32 * BC + o_b, b20, None)
        store_rn(p + 32 * BC + 16 + o_b, b21, None)
        store_rn(p + 32 * BC + 32 + o_b, b22, None)
        store_rn(p + 48 * BC + o_b, b30, None)
        store_rn(p + 48 * BC + 16 + o_b, b31, None)
        store_rn(p + 48 * BC + 32 + o_b, b32, None)
        store_rn(p + 48 * BC + 48 + o_b, b33, None)


@triton.jit(do_not_specialize=["tap_lo", "tap_hi", "n_sel", "c0"])
def kda_fwd_intra_solve_kernel(
    qn,              # [BT, H, K]: queries after l2norm (or the raw queries; with RS the raw ones times rq)
    kn,              # [BT, H, K]: keys after l2norm (or the raw keys; with RS the raw ones times rk)
    rq, rk,          # [BT, H] fp32 row scales (RS)
    gc,              # [BT, H, K] fp32
    b,               # [BT, H] fp32
    INV,             # out [NC, H, BC, BC] fp32: (I + L)^-1 (identity on padding)
    Mqk,             # out [NC, H, BC, BC] fp32 (bf16 with mqk_bf16): tril(qd ki^T) (0 on padding)
    chunk_start,     # [NC] int32
    chunk_len,       # [NC] int32
    scale,
    t_L, t_INV, t_Mqk,  # tap buffers [hi-lo, n_sel, BC, BC]
    head_slot, tap_lo, tap_hi, n_sel,
    c0,              # first chunk of this launch (common.chunk_launches)
    H: tl.constexpr,
    K: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    BF16: tl.constexpr,          # tensor-core dot operands (fast mode) instead of ieee fp32
    STORE_TAPS: tl.constexpr, TAP_L: tl.constexpr, TAP_INV: tl.constexpr, TAP_MQK: tl.constexpr,
    RS: tl.constexpr = 0,        # qn, kn from the raw q, k and the row scales (common.rowscale_mode)
    HEADS_FIRST: tl.constexpr = 0,  # 1: a 1-D grid, one chunk's heads adjacent (common.chunk_grid; same bits)
    GC_FROM_G: tl.constexpr = 0,  # 1: gc formed here from the raw gate g (infer_gc_from_g), not read
    g=None, A_log=None, dt_bias=None, lower_bound=0.0,  # (GC_FROM_G) as the token kernel's
    GATE: tl.constexpr = 0,
):
    """Per (chunk, head), on [16, 16] blocks: the lower blocks (s, j <= s) of ``L = Diag(b)
    strict_tril(kd ki^T)`` and ``Mqk = tril(qd ki^T)``, anchored per row block s at ``a = gc[16 s]``;
    then ``INV = (I + L)^-1``: each diagonal block by forward substitution in exact fp32, and below the
    diagonal ``INV_sj = -INV_ss sum_{j <= m < s} L_sm INV_mj`` (block forward substitution)."""
    if HEADS_FIRST:
        i_c, i_h, _ = chunk_head_block(c0, H, 1)
    else:
        i_c, i_h = tl.program_id(0) + c0, tl.program_id(1)
    NB: tl.constexpr = BC // 16
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n_valid = tl.load(chunk_len + i_c)
    o_ch = (i_c * H + i_h).to(tl.int64)
    z = tl.zeros([16, 16], dtype=tl.float32)
    k00, q00, k10, q10, k11, q11 = z, z, z, z, z, z
    k20, q20, k21, q21, k22, q22 = z, z, z, z, z, z
    k30, q30, k31, q31, k32, q32, k33, q33 = z, z, z, z, z, z, z, z
    a_h = 1.0
    if GC_FROM_G and GATE != 0:
        a_h = exp_(tl.load(A_log + i_h).to(tl.float32), BF16 == 0)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_dt = tl.zeros([BK], dtype=tl.float32)  # (GC_FROM_G) the gate's bias; cy: gc's carry across row blocks
        if GC_FROM_G and GATE != 0:
            b_dt = tl.load(dt_bias + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
        cy = tl.zeros([BK], dtype=tl.float32)
        rk0, rq0, a0, kb0, g0, m0, cy = _row_block(qn, kn, rq, rk, gc, bos, 0, n_valid, i_h, o_k, m_k,
                                                   scale, H, K, BF16 == 0, RS, cy, g, b_dt, a_h, lower_bound,
                                                   GATE, GC_FROM_G)
        k00, q00 = _pair(k00, q00, rk0, rq0, a0, kb0, g0, m0, BF16)
        if NB >= 2:
            rk1, rq1, a1, kb1, g1, m1, cy = _row_block(qn, kn, rq, rk, gc, bos, 1, n_valid, i_h, o_k, m_k,
                                                       scale, H, K, BF16 == 0, RS, cy, g, b_dt, a_h, lower_bound,
                                                       GATE, GC_FROM_G)
            k10, q10 = _pair(k10, q10, rk1, rq1, a1, kb0, g0, m0, BF16)
            k11, q11 = _pair(k11, q11, rk1, rq1, a1, kb1, g1, m1, BF16)
        if NB >= 4:
            rk2, rq2, a2, kb2, g2, m2, cy = _row_block(qn, kn, rq, rk, gc, bos, 2, n_valid, i_h, o_k, m_k,
                                                       scale, H, K, BF16 == 0, RS, cy, g, b_dt, a_h, lower_bound,
                                                       GATE, GC_FROM_G)
            k20, q20 = _pair(k20, q20, rk2, rq2, a2, kb0, g0, m0, BF16)
            k21, q21 = _pair(k21, q21, rk2, rq2, a2, kb1, g1, m1, BF16)
            k22, q22 = _pair(k22, q22, rk2, rq2, a2, kb2, g2, m2, BF16)
            rk3, rq3, a3, kb3, g3, m3, cy = _row_block(qn, kn, rq, rk, gc, bos, 3, n_valid, i_h, o_k, m_k,
                                                       scale, H, K, BF16 == 0, RS, cy, g, b_dt, a_h, lower_bound,
                                                       GATE, GC_FROM_G)
            k30, q30 = _pair(k30, q30, rk3, rq3, a3, kb0, g0, m0, BF16)
            k31, q31 = _pair(k31, q31, rk3, rq3, a3, kb1, g1, m1, BF16)
            k32, q32 = _pair(k32, q32, rk3, rq3, a3, kb2, g2, m2, BF16)
            k33, q33 = _pair(k33, q33, rk3, rq3, a3, kb3, g3, m3, BF16)

    o = tl.arange(0, 16)
    m_sl = o[:, None] > o[None, :]
    m_lo = o[:, None] >= o[None, :]
    o_m = o_ch * BC * BC
    i_slot = tl.load(head_slot + i_h) if STORE_TAPS else -1
    tapped = STORE_TAPS & (i_c >= tap_lo) & (i_c < tap_hi) & (i_slot >= 0)
    o_tap = ((i_c - tap_lo) * n_sel + i_slot).to(tl.int64) * BC * BC
    # M = tril(Aqk), stored first: its registers then serve the inverse
    q00 = tl.where(m_lo, q00, 0.0)
    q11 = tl.where(m_lo, q11, 0.0)
    q22 = tl.where(m_lo, q22, 0.0)
    q33 = tl.where(m_lo, q33, 0.0)
    _store_lower(Mqk + o_m, q00, q10, q11, q20, q21, q22, q30, q31, q32, q33, NB, BC)
    if tapped:
        if TAP_MQK:
            _store_lower(t_Mqk + o_tap, q00, q10, q11, q20, q21, q22, q30, q31, q32, q33, NB, BC)
    # L = Diag(b) strict_tril(A), block by block; each diagonal block's inverse by substitution, then
    # the blocks below the diagonal
    b0 = tl.load(b + (bos + o) * H + i_h, mask=o < n_valid, other=0)
    L00 = tl.where(m_sl, k00, 0.0) * b0[:, None]
    A00 = _unit_lower_inv(L00, tl.minimum(n_valid, 16))
    L10, L11, L20, L21, L22, L30, L31, L32, L33 = z, z, z, z, z, z, z, z, z
    A10, A11, A20, A21, A22, A30, A31, A32, A33 = z, z, z, z, z, z, z, z, z
    if NB >= 2:
        b1 = tl.load(b + (bos + 16 + o) * H + i_h, mask=16 + o < n_valid, other=0)
        L10 = k10 * b1[:, None]
        L11 = tl.where(m_sl, k11, 0.0) * b1[:, None]
        A11 = _unit_lower_inv(L11, tl.minimum(n_valid - 16, 16))
        A10 = -mm_tf32(A11, mm_tf32(L10, A00, BF16), BF16)
    if NB >= 4:
        b2 = tl.load(b + (bos + 32 + o) * H + i_h, mask=32 + o < n_valid, other=0)
        b3 = tl.load(b + (bos + 48 + o) * H + i_h, mask=48 + o < n_valid, other=0)
        L20, L21 = k20 * b2[:, None], k21 * b2[:, None]
        L22 = tl.where(m_sl, k22, 0.0) * b2[:, None]
        L30, L31, L32 = k30 * b3[:, None], k31 * b3[:, None], k32 * b3[:, None]
        L33 = tl.where(m_sl, k33, 0.0) * b3[:, None]
        A22 = _unit_lower_inv(L22, tl.minimum(n_valid - 32, 16))
        A33 = _unit_lower_inv(L33, tl.minimum(n_valid - 48, 16))
        A21 = -mm_tf32(A22, mm_tf32(L21, A11, BF16), BF16)
        A20 = -mm_tf32(A22, mm_tf32(L20, A00, BF16) + mm_tf32(L21, A10, BF16), BF16)
        A32 = -mm_tf32(A33, mm_tf32(L32, A22, BF16), BF16)
        A31 = -mm_tf32(A33, mm_tf32(L31, A11, BF16) + mm_tf32(L32, A21, BF16), BF16)
        A30 = -mm_tf32(A33, mm_tf32(L30, A00, BF16) + mm_tf32(L31, A10, BF16) + mm_tf32(L32, A20, BF16), BF16)
    _store_lower(INV + o_m, A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, NB, BC)
    if tapped:
        if TAP_L:
            _store_lower(t_L + o_tap, L00, L10, L11, L20, L21, L22, L30, L31, L32, L33, NB, BC)
        if TAP_INV:
            _store_lower(t_INV + o_tap, A00, A10, A11, A20, A21, A22, A30, A31, A32, A33, NB, BC)


@triton.jit
def kda_fwd_wu_kernel(
    v,               # [BT, H, V] value
    kn,              # [BT, H, K]: keys after l2norm (or the raw keys; with RS the raw ones times rk)
    rk,              # [BT, H] fp32 row scales (RS)
    gc,              # [BT, H, K] fp32
    b,               # [BT, H] fp32
    INV,             # [NC, H, BC, BC] fp32
    w,               # out [BT, H, K] fp32 (bf16 with FWD_LOWP & 1): INV Diag(b) kd
    u,               # out [BT, H, V] fp32 (bf16 with FWD_LOWP & 4): INV Diag(b) v
    chunk_start,     # [NC] int32
    chunk_len,       # [NC] int32
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,            # column block of both products
    BF16: tl.constexpr,
    RS: tl.constexpr = 0,        # kn from the raw k and the row scales (common.rowscale_mode)
    HEADS_FIRST: tl.constexpr = 0,  # 1: a 1-D grid, one chunk's heads adjacent (common.chunk_grid; same bits)
):
    """The WY products of one chunk, ``w = INV Diag(b) kd`` and ``u = INV Diag(b) v``, in one program (``INV``
    and ``b`` read once: the kernel 0.394 -> 0.350 ms against a program each, lower-bound H32 T16384,
    docs/gpu/round30/call1)."""
    if HEADS_FIRST:
        i_c, i_h, _ = chunk_head_block(0, H, 1)
    else:
        i_c, i_h = tl.program_id(0), tl.program_id(1)
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n_valid = tl.load(chunk_len + i_c)
    o_t = tl.arange(0, BC)
    m_t = o_t < n_valid
    o_tok = bos + o_t
    o_ch = (i_c * H + i_h).to(tl.int64)
    b_inv = tl.load(INV + o_ch * BC * BC + o_t[:, None] * BC + o_t[None, :])
    b_b = tl.load(b + o_tok * H + i_h, mask=m_t, other=0)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_tk = m_t[:, None] & (o_k < K)[None, :]
        o_tk = (o_tok[:, None] * H + i_h) * K + o_k[None, :]
        b_kd = load_qk(kn, o_tk, m_tk, rk, o_tok * H + i_h, m_t, RS) * exp_(
            tl.load(gc + o_tk, mask=m_tk, other=0), BF16 == 0)
        store_rn(w + o_tk, mm_tf32(b_inv, b_kd * b_b[:, None], BF16), m_tk)
    for i_v in range(tl.cdiv(V, BK)):
        o_v = i_v * BK + tl.arange(0, BK)
        m_v = (o_v < V)[None, :]
        b_v = tl.load(v + (o_tok[:, None] * H + i_h) * V + o_v[None, :], mask=m_t[:, None] & m_v,
                      other=0).to(tl.float32)
        store_rn(u + (o_tok[:, None] * H + i_h) * V + o_v[None, :], mm_tf32(b_inv, b_v * b_b[:, None], BF16),
                 m_t[:, None] & m_v)


def qk_lowp_mode(precision: str, qk_l2norm: bool) -> int:
    """How bf16 mode stores the l2-normalised ``qn, kn`` (knob ``PREP_QK_LOWP``; bf16 mode with l2norm only,
    else 0): 2 (the default) in fp16, 1 in bf16, each rounded to nearest once by the token kernel, 0 in
    fp32. Every later use (the token kernel's own ``qd``, ``kr``, the intra, w/u and output passes, the
    backward) reads the rounded values, 2 bytes per element instead of 4, as without l2norm (where ``qn,
    kn`` are the bf16 inputs themselves). A normalised row has every element within [-1, 1], so fp16
    cannot overflow; it keeps 11 significant bits, as many as the tf32 products that read ``qn, kn`` take,
    and below 6.1e-5 an absolute error of at most 3e-8. On the H200 at lower-bound H32 T16384 fp16 against
    fp32 took the forward 2.059 -> 1.911 ms and forward + backward 8.578 -> 8.387 (token kernel 0.664 ->
    0.588, intra 0.541 -> 0.495, w/u 0.351 -> 0.327, backward precompute 0.451 -> 0.426;
    docs/gpu/round32/call1), and the bf16 case table passed. bf16 (what fla stores) was as fast, but
    ``dA_log`` then missed fla's bar in two cases of that table (1.41e-2 against 1e-2, ``beta_high``,
    ``raw_beta_extremes``, docs/gpu/round23/call6/gpu_tests.log); in CPU emulation over 4 seeds
    (``benchmarks/bf16_margin.py``) fp16's margins stay near fp32's (``kimi_c64`` ``dA_log`` mean 0.29 of
    its bar against 0.23, bf16 0.61)."""
    if precision != "bf16" or not qk_l2norm:
        return 0
    mode = knob("PREP_QK_LOWP", 2)
    if mode not in (0, 1, 2):
        raise KnobError(f"KDADBG_PREP_QK_LOWP={mode}: expected 0 (fp32), 1 (bf16) or 2 (fp16)")
    return mode


def qk_rowscale(precision: str, qk_l2norm: bool) -> bool:
    """Whether fp32 mode keeps the l2norm as row scales (knob ``QK_ROWSCALE``, default on; fp32 mode with
    l2norm): the token kernel stores ``rq, rk = 1 / sqrt(sum x^2 + 1e-6)`` [BT, H] and no ``qn, kn``; every
    later kernel loads the raw q, k and forms ``qn = q * rq`` itself (``tlmath.load_qk``), the same fp32
    product as a stored ``qn``: the same bits (CPU and H200 tests), with ``2 [BT, H, K]`` fp32 tensors
    fewer written and kept for the backward. bf16 mode stores fp16 ``qn, kn`` instead (``qk_lowp_mode``): there
    the row scales were slower in the backward's K pass (spills) and, on the H200, not bit-identical in
    ``dq`` with bf16 inputs."""
    return qk_l2norm and precision == "fp32" and bool(knob("QK_ROWSCALE", 1))


def rowscale_for_inference(precision: str, qk_l2norm: bool, chunk_size: int) -> bool:
    """Whether a forward with no backward to follow keeps the l2norm as row scales in bf16 mode (knob
    ``INFER_ROWSCALE``, default on; with l2norm and no taps): the token kernel then writes ``rq, rk`` [BT, H]
    instead of the two ``[BT, H, K]`` tensors ``qn, kn``, and the intra, w/u and output kernels form ``qn = q *
    rq`` from the raw q, k and round it as the token kernel does (``tlmath.load_qk``, ``common.rowscale_mode``),
    in the same launch (at chunk 64 with the gate in the kernel its K blocks of 16, over which the row sums
    add): the same bits of ``o`` and the final state as the training forward, whose backward's K pass reads
    the stored ``qn, kn`` (it spilled forming them itself, ``qk_rowscale``). At chunk 64 only where they are
    rounded (fp16 or bf16, ``qk_lowp_mode``): the rounding of the product is what keeps it out of a fused
    multiply-add; with fp32 ``qn, kn`` at chunk 64, ``o`` and the final state moved on the H200 (6 of 16384
    and 96 of 2048 elements, case ``kimi_c64``, ``docs/gpu/round28/call3/probe.log``). Kept as row scales in
    training too, the forward at lower-bound H32 T16384 took 2.024 -> 1.976 ms on an H100 (token kernel
    0.561 -> 0.475, intra 0.487 -> 0.515) and every output kept its bits on CUDA, but the backward then formed
    and stored ``qn, kn`` for its K pass (its precompute 0.447 -> 0.626 ms, forward + backward 7.820 -> 7.915;
    ``docs/gpu/round55/call3``, ``call1s``): not kept. With ``qn, kn`` stored instead (``INFER_ROWSCALE=0``)
    the inference forward at lower-bound H64 T8192 took 1.803 ms at chunk 64 against 1.792 with row scales,
    1.672 against 1.572 at chunk 16, and at H32 T65536 7.461 against 7.193 at chunk 64, in one process on an
    H100 (``docs/gpu/round56/call4``, whose CUDA tests of these bits passed)."""
    return precision == "bf16" and qk_l2norm and (chunk_size < 64 or qk_lowp_mode(precision, qk_l2norm) != 0) \
        and bool(knob("INFER_ROWSCALE", 1))


def mqk_bf16(precision: str) -> bool:
    """Whether ``Mqk`` is stored in bf16 (knob ``MQK_BF16``, bf16 mode, default on): every reader uses it
    only as a bf16 MMA operand, rounded to nearest even (the forward state pass's and the output pass's
    ``Mqk U``, the backward's ``Mqk^T dO``), so storing the rounded value keeps every bit and halves the
    bytes that the intra kernel writes and the state passes read per chunk. Its tap is then not read from
    ``Mqk`` (``TapPlan.own``): the intra kernel stores the fp32 values from its registers, as before."""
    return precision == "bf16" and bool(knob("MQK_BF16", 1))


def infer_gc_from_g(precision: str, infer: bool, fuse_wu: bool) -> bool:
    """Whether the inference forward stores no ``gc`` (knob ``INFER_GC_FROM_G``, bf16 mode; default 0 until a GPU
    times it): with the w/u kernel fused away (``chunk.fuse_wu``), no backward to follow and no taps, the intra
    kernel is the one reader of ``gc`` left, and it forms ``gc`` itself from the raw gate, 16 rows at a time
    with a carry (``_gc_block``), as the token kernel forms it (``gate_act``, then a cumsum): the token kernel
    writes 4 bytes an element fewer and the intra kernel reads the 2-byte raw gate where it read the 4-byte
    ``gc``. The cumsum adds in another order than the token kernel's, so ``gc`` (and ``INV``, ``Mqk``, ``o``)
    may move by roundings."""
    return precision == "bf16" and infer and fuse_wu and bool(knob("INFER_GC_FROM_G", 0))


def kda_fwd_prepare(q, k, v, g, beta, chunks, *, scale, gate, lower_bound, qk_l2norm, beta_sigmoid,
                    A_log, dt_bias, precision, tap_plan=None, store_qd=False, keep_state=True, fuse_wu=False):
    """Stage 1 on flattened inputs (q, k, g [BT,H,K]; v [BT,H,V]; beta [BT,H]).

    Returns ``qn, kn, gc, w [BT,H,K]`` (fp32; without l2norm ``qn, kn`` are ``q, k`` themselves, in their
    own dtype: the same values, no copy; fp16 or bf16 with ``qk_lowp_mode``; with ``qk_rowscale`` the raw ``q, k``, to be
    scaled by ``rq, rk``); ``krT [NC,H,K,C]; b [BT,H]; u [BT,H,V]; gT [NC,H,K]; INV, Mqk [NC,H,C,C]``;
    ``qd [BT,H,K]`` (``scale qn exp(gc)``, bf16 in bf16 mode) when ``store_qd``, else None; ``rq, rk
    [BT,H]`` fp32 with ``qk_rowscale``, else None. ``keep_state=False`` (no backward follows) without
    ``tap_plan``: with l2norm the row scales replace them in bf16 mode too
    (``rowscale_for_inference``). ``w``, ``krT`` and ``u`` are bf16 in bf16 mode (``common.fwd_lowp``).
    ``krT`` is ``kn exp(gT - gc)`` transposed per chunk: the recurrence's ``kr^T U`` then reads its left
    operand with the reduction axis contiguous, as the MMAs need. ``fuse_wu`` (``chunk.fuse_wu``): no w/u
    kernel; ``w`` is then ``kd = kn exp(gc)`` in bf16, stored by the token kernel, and ``u`` None (the state
    pass forms ``U`` from ``v``, ``b`` and ``INV``). ``gc`` is None where no later kernel reads it
    (``infer_gc_from_g``).
    """
    BT, H, K = q.shape
    V = v.shape[-1]
    C, NC = chunks.chunk_size, chunks.n_chunks
    dev, f32 = q.device, torch.float32
    qk_lowp = qk_lowp_mode(precision, qk_l2norm)
    qk_dtype = {0: f32, 1: torch.bfloat16, 2: torch.float16}[qk_lowp]
    infer = not keep_state and tap_plan is None
    rs = qk_rowscale(precision, qk_l2norm) or (infer and rowscale_for_inference(precision, qk_l2norm, C))
    store_qk = qk_l2norm and not rs
    qn, kn = (torch.empty(BT, H, K, device=dev, dtype=qk_dtype) for _ in range(2)) if store_qk else (q, k)
    rq, rk = (torch.empty(BT, H, device=dev, dtype=f32) for _ in range(2)) if rs else (None, None)
    lowp = fwd_lowp(precision)
    io = [torch.bfloat16 if lowp & bit else f32 for bit in (1, 2, 4)]
    gc_from_g = infer_gc_from_g(precision, infer, fuse_wu)
    gc = None if gc_from_g else torch.empty(BT, H, K, device=dev, dtype=f32)
    w = torch.empty(BT, H, K, device=dev, dtype=torch.bfloat16 if fuse_wu else io[0])
    krT = torch.empty(NC, H, K, C, device=dev, dtype=io[1])
    u = None if fuse_wu else torch.empty(BT, H, V, device=dev, dtype=io[2])
    b = torch.empty(BT, H, device=dev, dtype=f32)
    gT = torch.empty(NC, H, K, device=dev, dtype=f32)
    qd = torch.empty(BT, H, K, device=dev, dtype=torch.bfloat16 if precision == "bf16" else f32) \
        if store_qd else None
    INV = torch.empty(NC, H, C, C, device=dev, dtype=f32)
    mqk_lowp = mqk_bf16(precision)
    if mqk_lowp and tap_plan is not None:
        tap_plan.own("Mqk")  # the tap keeps the fp32 values: stored from the intra kernel's registers
    Mqk = torch.empty(NC, H, C, C, device=dev, dtype=torch.bfloat16 if mqk_lowp else f32)
    if NC == 0:
        return qn, kn, gc, krT, b, w, u, gT, INV, Mqk, qd, rq, rk
    if tap_plan is not None:
        tap_plan.alias(chunks, gc=gc, gT=gT, b=b, INV=INV, Mqk=Mqk)
    has_gate, bf16 = GATE_IDS[gate] != 0, precision == "bf16"
    bufs, slot, lo, hi, n_sel, store, present = tap_kernel_args(tap_plan, TOKEN_TAPS, qn, chunks)
    # the token kernel's K blocks: 64 for pre-gated inputs (the forward's prepare 1.423 -> 1.405 ms at
    # H32 T16384 against 32); 32 with the gate or l2norm in the kernel (its registers: 0.815 -> 0.642 ms
    # with the softplus gate, 0.682 -> 0.631 lower-bound, H32 T16384); for the WY products blocks of 32
    # (with w and u in bf16): 1.423 -> 1.323 against 64. At chunk 64 with the gate and the l2norm in the
    # kernel (bf16 mode, or fp32 mode storing qn, kn: QK_ROWSCALE=0), blocks of 16 at 8 warps (measured with
    # qn, kn stored, the token kernel at H32 T16384: lower-bound 0.700 -> 0.665 ms, softplus 0.768 -> 0.671
    # against each K block of 32 in a program of its own at 8 warps; 32 at 16 warps 0.946 and 0.688,
    # docs/gpu/round30/call2). The row sums add per K block, so the block also keeps rq, rk's bits in the
    # inference forward's row scales (rowscale_for_inference)
    wide = has_gate and qk_l2norm and C == 64 and not qk_rowscale(precision, qk_l2norm)
    bk = knob("PREP_BK", block_size(K, 16 if wide else 32 if has_gate or qk_l2norm else 64))
    warps = knob("PREP_WARPS", 8 if wide else 4)
    # at that launch its K-block loops unrolled, each step loading the next block's q, k, g before its own
    # work (launch-only, the same bits): the token kernel 0.589 -> 0.523 ms lower-bound, 0.601 -> 0.526
    # softplus at H32 T16384 (docs/gpu/round34/call3); pre-gated (4 warps, blocks of 64) loading ahead was
    # slower, 0.367 -> 0.402
    unroll = knob("PREP_UNROLL", cdiv(K, bk) if wide else 0)
    ahead = knob("PREP_AHEAD", 1 if wide else 0)
    hf = heads_first()
    for c0, c1, taps in chunk_launches(tap_plan, NC):
        on = {n: taps and present[n] for n in TOKEN_TAPS}
        kda_fwd_token_kernel[chunk_grid(c1 - c0, H, first=hf, grid=(c1 - c0, H))](
            q=q, k=k, g=g, beta=beta, A_log=A_log if has_gate else qn, dt_bias=dt_bias if has_gate else qn,
            qn=qn, kn=kn, rq=b if rq is None else rq, rk=b if rk is None else rk, gc=b if gc is None else gc, krT=krT,
            qd=qn if qd is None else qd, kd=w, b=b, gT=gT,
            chunk_start=chunks.chunk_start, chunk_len=chunks.chunk_len, scale=float(scale),
            lower_bound=float(lower_bound), **{f"t_{n}": x for n, x in zip(TOKEN_TAPS, bufs)}, head_slot=slot,
            tap_lo=lo, tap_hi=hi, n_sel=n_sel, c0=c0,
            H=H, K=K, BC=C, BK=bk,
            GATE=GATE_IDS[gate],
            L2NORM=qk_l2norm, BETA_SIGMOID=beta_sigmoid, STORE_QK=store_qk, STORE_RS=rs, QK_LOWP=qk_lowp,
            GC_F64=knob("GC_F64", 0 if bf16 else 1) != 0, PRECISE=not bf16, STORE_QD=qd is not None,
            STORE_KD=fuse_wu,
            STORE_TAPS=store and taps, TAP_GC=on["gc"], TAP_GT=on["gT"], TAP_B=on["b"], TAP_QD=on["qd"],
            TAP_KD=on["kd"], TAP_KI=on["ki"], TAP_KR=on["kr"], UNROLL=unroll, AHEAD=ahead, HEADS_FIRST=hf,
            STORE_GC=gc is not None, **LAUNCH,
            num_warps=warps,
            num_stages=knob("PREP_STAGES", 3),
            **reg_cap(knob("PREP_MAXNREG", 0)),
        )
    (t_L, t_inv, t_M), slot, lo, hi, n_sel, store, present = tap_kernel_args(tap_plan, ("L", "INV", "Mqk"), qn,
                                                                             chunks)
    for c0, c1, taps in chunk_launches(tap_plan, NC):
        kda_fwd_intra_solve_kernel[chunk_grid(c1 - c0, H, first=hf, grid=(c1 - c0, H))](
            qn=qn, kn=kn, rq=b if rq is None else rq, rk=b if rk is None else rk, gc=b if gc is None else gc, b=b,
            INV=INV, Mqk=Mqk,
            chunk_start=chunks.chunk_start, chunk_len=chunks.chunk_len, scale=float(scale), t_L=t_L, t_INV=t_inv,
            t_Mqk=t_M, head_slot=slot, tap_lo=lo, tap_hi=hi,
            n_sel=n_sel, c0=c0, H=H, K=K, BC=C, BK=knob("PREP_SOLVE_BK", block_size(K, 16)),
            BF16=bf16, STORE_TAPS=store and taps, TAP_L=taps and present["L"], TAP_INV=taps and present["INV"],
            TAP_MQK=taps and present["Mqk"], RS=rowscale_mode(rs, qk_lowp), HEADS_FIRST=hf,
            GC_FROM_G=gc_from_g, g=g, A_log=A_log if has_gate else b, dt_bias=dt_bias if has_gate else b,
            lower_bound=float(lower_bound), GATE=GATE_IDS[gate], **LAUNCH,
            num_warps=knob("PREP_SOLVE_WARPS", 1),
            # 2 stages: the kernel 0.620 -> 0.522 ms against 3 (1: 0.602), lower-bound H32 T16384,
            # docs/gpu/round30/call9
            num_stages=knob("PREP_SOLVE_STAGES", 2),
        )
    if fuse_wu:
        return qn, kn, gc, krT, b, w, u, gT, INV, Mqk, qd, rq, rk
    kda_fwd_wu_kernel[chunk_grid(NC, H, first=hf, grid=(NC, H))](
        v=v, kn=kn, rk=b if rk is None else rk, gc=gc, b=b, INV=INV, w=w, u=u, chunk_start=chunks.chunk_start,
        chunk_len=chunks.chunk_len, H=H, K=K, V=V, BC=C, BK=knob("PREP_WU_BK", block_size(max(K, V), 32)),
        BF16=bf16, RS=rowscale_mode(rs, qk_lowp), HEADS_FIRST=hf, **LAUNCH,
        num_warps=knob("PREP_WU_WARPS", 4), num_stages=knob("PREP_WU_STAGES", 3),
    )
    return qn, kn, gc, krT, b, w, u, gT, INV, Mqk, qd, rq, rk
