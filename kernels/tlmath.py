"""Triton device helpers shared by the forward and backward stages: the matmul precision modes, the
stable sigmoid/softplus and the gate activations of spec §1.3 (natural-log units), a sequence's rows, a
tap buffer's slot, and the rounding bf16 store.

Precision modes of a product (the ``BF16`` argument: 0 exact, else the fast mode; the backward passes
its ``DOT``, ``common.dot_mode``): ``mm`` is one MMA (ieee fp32, or bf16 operands in the fast mode);
``mm_tf32`` is ieee fp32, or in the fast mode one tf32 MMA (10 mantissa bits). The fast forward uses
``mm_tf32`` where an error would be carried on (the anchored ``kd ki^T`` and ``qd ki^T``, the ``INV``
products, ``w``, ``u``) and ``mm`` for the output ``o`` and the state pass (``common.fwd_lowp``, which
about doubles ht's error, still well inside fla's 5e-3 bar on the H200). With bf16 operands everywhere, o
and ht landed too close to the bar (docs/kernels.md, Numerics).
"""

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

from .tuning import knob

# The CPU interpreter multiplies bf16 operands as raw 16-bit integers; there the fast mode is
# emulated by rounding the operands to bf16 (round-to-nearest-even) and multiplying in fp32, which
# is what a bf16 tensor-core MMA with fp32 accumulation computes.
INTERPRET = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")

# exp in the fast mode on the GPU as ``ex2.approx.ftz`` (knob ``EXP_FTZ``, read once at import: a global
# constexpr, part of every kernel's cache key): see ``exp_``.
EXP_FTZ = tl.constexpr(bool(knob("EXP_FTZ", 1)))

GATE_IDS = {"none": 0, "lower_bound": 1, "softplus": 2}  # the kernels' GATE constexpr


@triton.jit
def round_mantissa(x, DROP: tl.constexpr):
    """Round to ``23 - DROP`` mantissa bits (nearest, ties to even), kept in fp32: DROP 16 is bf16."""
    u = x.to(tl.float32).to(tl.uint32, bitcast=True)
    u = ((u + ((1 << (DROP - 1)) - 1) + ((u >> DROP) & 1)) >> DROP) << DROP
    return u.to(tl.float32, bitcast=True)


@triton.jit
def round_bf16(x):
    """``x`` rounded to bf16 (nearest, ties to even), kept in fp32: the GPU's conversion, emulated under the
    interpreter (whose conversion truncates)."""
    if INTERPRET:
        return round_mantissa(x, 16)
    else:
        return x.to(tl.bfloat16).to(tl.float32)


@triton.jit
def truncate_mantissa(x, DROP: tl.constexpr):
    """Drop the low ``DROP`` mantissa bits (toward zero), kept in fp32: DROP 13 is tf32 as the tensor
    cores read fp32 operands."""
    u = x.to(tl.float32).to(tl.uint32, bitcast=True)
    return ((u >> DROP) << DROP).to(tl.float32, bitcast=True)


@triton.jit
def mm(a, b, BF16: tl.constexpr):
    """a @ b with fp32 accumulation: bf16 operands (fast mode, ``BF16`` non-zero) or exact fp32 ("ieee",
    debug mode)."""
    if BF16:
        if INTERPRET:
            return tl.dot(round_mantissa(a, 16), round_mantissa(b, 16), input_precision="ieee")
        else:
            return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def mm_operand(a, BF16: tl.constexpr):
    """``a`` as ``mm`` reads it, converted once: bf16 in the fast mode on the GPU (the same bits ``mm``'s
    own conversion gives), ``a`` itself otherwise. For an operand reused across a loop of products."""
    if BF16 and not INTERPRET:
        return a.to(tl.bfloat16)
    else:
        return a


@triton.jit
def mm_tf32(a, b, BF16: tl.constexpr):
    """a @ b with fp32 accumulation: tf32 operands (fast mode: one MMA, 10 mantissa bits) or ieee fp32.
    The backward uses it for the gate-sensitive intra-chunk products, whose errors the reverse cumsum
    of dgc would otherwise expose (as fla does)."""
    if BF16:
        if INTERPRET:
            return tl.dot(truncate_mantissa(a, 13), truncate_mantissa(b, 13), input_precision="ieee")
        else:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32")
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def round_qk(x, QK_LOWP: tl.constexpr):
    """The l2-normalised ``qn`` or ``kn`` rounded as bf16 mode stores it (``prepare.qk_lowp_mode``), kept in
    fp32: 0 not at all, 1 to bf16, 2 to fp16, both to nearest (|qn| <= 1: no fp16 overflow; below 6e-5
    subnormal, absolute error 3e-8)."""
    if QK_LOWP == 1:
        return round_bf16(x)
    elif QK_LOWP == 2:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


@triton.jit
def load_qk(x, o_x, m_x, r, o_row, m_row, RS: tl.constexpr):
    """Rows of ``qn`` or ``kn`` as fp32: ``x[o_x]``, or with ``RS`` (row scales: ``x`` is the raw q or k)
    ``x[o_x] * r[o_row]`` per row, the product the token kernel forms (``prepare.qk_rowscale``), rounded
    as the token kernel rounds it (``RS = 1 + QK_LOWP``, ``common.rowscale_mode``; ``round_qk``): the same
    values as stored ones, from the 2-byte inputs. Masked rows are 0."""
    b_x = tl.load(x + o_x, mask=m_x, other=0).to(tl.float32)
    if RS:
        b_x = round_qk(b_x * tl.load(r + o_row, mask=m_row, other=0)[:, None], RS - 1)
    return b_x


@triton.jit
def seq_span(chunk_start, chunk_len, c_lo, c_hi):
    """First row and end (one past the last row) of the sequence whose chunks are ``[c_lo, c_hi)``
    (0, 0 when it has none). Its chunks are consecutive and C rows apart (common.chunk_layout), so a
    state pass gets each chunk's rows by arithmetic: no load in its loop waits on another load."""
    c_last = tl.maximum(c_hi - 1, c_lo)
    bos0 = tl.load(chunk_start + c_lo, mask=c_lo < c_hi, other=0).to(tl.int64)
    eos = tl.load(chunk_start + c_last, mask=c_lo < c_hi, other=0).to(tl.int64) \
        + tl.load(chunk_len + c_last, mask=c_lo < c_hi, other=0)
    return bos0, eos


@triton.jit
def tap_index(c, i_h, tap_lo, tap_hi, head_slot, n_sel):
    """Flat ``[hi-lo, n_sel]`` index of (chunk c, head i_h) in a tap buffer, and whether to write it."""
    return slot_index(c, tl.load(head_slot + i_h), tap_lo, tap_hi, n_sel)


@triton.jit
def slot_index(c, slot, tap_lo, tap_hi, n_sel):
    """``tap_index`` from the head's slot ``head_slot[i_h]`` already loaded."""
    on = (c >= tap_lo) & (c < tap_hi) & (slot >= 0)
    idx = tl.where(on, (c - tap_lo) * n_sel + slot, 0).to(tl.int64)
    return idx, on


@triton.jit
def store_rn(ptr, x, mask):
    """``tl.store`` that rounds to nearest even into a bf16 output, as ``torch``'s ``.to`` and the GPU's
    store conversion do (the CPU interpreter's store conversion truncates)."""
    if INTERPRET:
        if ptr.dtype.element_ty == tl.bfloat16:
            x = round_mantissa(x, 16)
    tl.store(ptr, x, mask=mask)


@triton.jit
def exp_(x, PRECISE: tl.constexpr):
    """exp; with ``PRECISE`` (fp32 mode) on the GPU libdevice's ``expf``. Triton's ``tl.exp`` is ``ex2.approx``
    of ``x·log2(e)`` rounded to fp32, whose relative error grows as ``|x|·2^-24`` (about 5e-6 at |x| = 80,
    which gates of chunk 16 and 64 reach). (Measured on the H200: the model-size fp32 taps' errors did not
    move with it; the states were what carried their excess, ``common.state_f64``.) Under the interpreter
    (NumPy's exp) ``tl.exp``; in the fast mode on the GPU (knob ``EXP_FTZ``, on by default; 0 gives ``tl.exp``)
    ``ex2.approx.ftz`` of ``x·log2(e)``: the product and the instruction ``tl.exp`` lowers to, without the
    fix-up that gives subnormal results (a compare and two conditional multiplies per exp, sm_90): results
    below 2^-126 (x < -87.3) are 0 instead of subnormal, every other result the same bits. Over a forward +
    backward at chunk 64 that is 7 to 10 % fewer sm_90 instructions in the token, intra, backward
    precompute and K pass kernels (``benchmarks/kernel_resources.py --sass``). Measured on the H200
    (docs/gpu/round42): the K pass 3.28 -> 2.93 ms and forward + backward 4 to 5 % faster in the three gate
    settings at H32 T16384, H64 T8192, H16 T16384; the same bits of o and every gradient at lower-bound H16
    T8192 (``benchmarks/bits_ab.py``)."""
    if PRECISE and not INTERPRET:
        return libdevice.exp(x)
    elif EXP_FTZ and not INTERPRET and x.dtype == tl.float32:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x * 1.4426950408889634],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.exp(x)


@triton.jit
def div_(a, b, PRECISE: tl.constexpr):
    """a / b; with ``PRECISE`` on the GPU IEEE division (``div.rn``) rather than Triton's ``div.full``
    (2 ulp)."""
    if PRECISE and not INTERPRET:
        return tl.div_rn(a, b)
    else:
        return a / b


@triton.jit
def rsqrt_(x, PRECISE: tl.constexpr):
    """1 / sqrt(x); with ``PRECISE`` on the GPU from IEEE sqrt and division (``tl.sqrt`` and ``/`` are the
    approximate instructions there)."""
    if PRECISE and not INTERPRET:
        return tl.div_rn(1.0, tl.sqrt_rn(x))
    else:
        return 1.0 / tl.sqrt(x)


@triton.jit
def log_(x, PRECISE: tl.constexpr):
    """log; with ``PRECISE`` on the GPU libdevice's ``logf`` rather than ``lg2.approx``."""
    if PRECISE and not INTERPRET:
        return libdevice.log(x)
    else:
        return tl.log(x)


@triton.jit
def sigmoid(x, PRECISE: tl.constexpr = False):
    # exp of a non-positive argument only: no overflow, full relative accuracy on both tails
    e = exp_(-tl.abs(x), PRECISE)
    return tl.where(x >= 0, div_(1.0, 1.0 + e, PRECISE), div_(e, 1.0 + e, PRECISE))


@triton.jit
def softplus(x, PRECISE: tl.constexpr = False):
    # log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)); a two-term series replaces log1p for tiny e
    e = exp_(-tl.abs(x), PRECISE)
    return tl.maximum(x, 0.0) + tl.where(e < 1e-4, e * (1.0 - 0.5 * e), log_(1.0 + e, PRECISE))


@triton.jit
def gate_act(b_g, b_dt, a_h, lower_bound, GATE: tl.constexpr, PRECISE: tl.constexpr = False):
    """Per-token natural-log decay gamma from the raw gate [BC, BK] (b_dt [BK], a_h = exp(A_log[h]))."""
    if GATE == 1:
        return lower_bound * sigmoid(a_h * (b_g + b_dt[None, :]), PRECISE)
    elif GATE == 2:
        return -a_h * softplus(b_g + b_dt[None, :], PRECISE)
    else:
        return b_g


@triton.jit
def prefetch_l2(p):
    """Ask for the 128-byte line at each address of ``p`` to be brought into L2 (PTX ``prefetch.global.L2``):
    no value is read into registers and nothing waits, so a later load of those lines comes from L2 rather
    than memory. On the GPU inline PTX; under the interpreter, which has no cache, a load whose value is dropped,
    so that the addresses are those of a load (``tests/bounds.py`` checks each lies inside a tensor)."""
    if not INTERPRET:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [p], dtype=tl.int32,
                                  is_pure=False, pack=1)
    else:
        tl.load(p)


@triton.jit
def chunk_head_block(c0, H, NB):
    """``(chunk, head, block)`` of a program of a kernel parallel over chunks, heads and ``NB`` blocks of K or
    V (1: none) on a 1-D grid (``common.chunk_grid`` with ``heads_first``): program ``((chunk - c0) H + head)
    NB + block``, so that the programs the GPU runs together are one chunk's heads and blocks, which read and
    write neighbouring rows of the ``[BT, H, .]`` tensors, rather than one head's chunks, which are ``H`` rows
    apart."""
    p = tl.program_id(0)
    return p // NB // H + c0, p // NB % H, p % NB
