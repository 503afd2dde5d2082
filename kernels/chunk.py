"""Chunked KDA on Triton: the forward as a list of stages (prepare → state pass → output pass), the
forward+backward call ``kdadbg run`` makes, and the autograd op ``chunk_kda``."""

from __future__ import annotations

import functools

import torch

from .common import PRECISIONS, FwdSaved, KernelChunks, TapPlan, TapWindow, chunk_layout
from .prepare import kda_fwd_prepare, kda_fwd_token_kernel, qk_lowp_mode
from .recurrence import fuse_out, kda_fwd_output, kda_fwd_recurrence
from .taps import TapSelection
from .tlmath import GATE_IDS
from .tuning import KnobError, cdiv, knob

CHUNK_SIZES = (16, 32, 64)
MAX_HEAD_DIM = 256
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _expect(ok: bool, name: str, expected: str, found) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}, found {found}")


class DeviceError(RuntimeError):
    """Tensors on a device the kernels cannot run on in this process: CPU tensors without Triton's
    interpreter (else Triton's own ``0 active drivers``, ``cannot be accessed from Triton`` or
    ``InterpreterError`` at the first launch)."""


def _cpu_refusal() -> str | None:
    """Why CPU tensors cannot run in this process, None when they can: Triton picks compiler or interpreter
    as ``@triton.jit`` decorates, ours here and ``triton.language``'s own functions (``tl.sum``, ...) when
    ``triton`` was first imported."""
    import triton.language as tl

    if type(kda_fwd_token_kernel).__name__ != "InterpretedFunction":
        return "Triton was imported without TRITON_INTERPRET=1, so the kernels were built for a GPU"
    if type(getattr(tl, "sum", None)).__name__ == "JITFunction":
        return "triton was imported before TRITON_INTERPRET=1 was set, so its interpreter cannot run the kernels"
    return None


def _device_errors(fn):
    """``fn`` (an entry point whose first argument is ``q``) with Triton's failure on CPU tensors where its
    interpreter is not on (``0 active drivers`` without a GPU, ``Pointer argument ... cannot be accessed from
    Triton`` with one, or the interpreter's ``InterpreterError``) turned into one line saying
    what to do. Nothing is checked before the call: tools that run the op on CPU tensors with the launches
    intercepted (``benchmarks/kernel_resources.py``) keep working, and a call on the GPU pays one frame."""

    @functools.wraps(fn)
    def entry(q, *args, **kwargs):
        try:
            return fn(q, *args, **kwargs)
        except Exception as e:
            # no GPU: Triton has no driver; with one: its launcher refuses the CPU pointer
            driver = (isinstance(e, RuntimeError) and "active drivers" in str(e)) or (
                isinstance(e, ValueError) and "cannot be accessed from Triton" in str(e))
            if not (driver or type(e).__name__ == "InterpreterError") or not getattr(q, "is_cpu", False):
                raise
            why = _cpu_refusal()
            if why is None:
                raise
            raise DeviceError(f"kdadbg_kernels: q is on device cpu, but {why}; set TRITON_INTERPRET=1 before "
                              f"importing triton or kdadbg_kernels (the CPU runs them under Triton's interpreter), "
                              f"or pass CUDA tensors") from None

    return entry


def bwd_fwd_operands(precision: str) -> int:
    """Which of the training forward's state-pass operands the backward's reverse state pass reads (knob
    ``BWD_FWD_OPERANDS``, a bit mask, bf16 mode, where the token kernel stores ``qd``): 1 ``qd`` (the
    backward's prep kernel formed the same product, ``scale qn exp(gc)``, and the reverse pass rounds it
    to bf16 as the forward stored it: the same bits), kept for the backward so that the prep kernel
    forms it no more; 2 ``w``, the forward's ``INV Diag(b) kn exp(gc)`` from a tf32 product where the
    backward's own is a bf16 one (results move). The default 1: at lower-bound H32 T16384 the prep kernel
    0.730 -> 0.581 ms, forward + backward 9.643 -> 9.468 (``docs/gpu/round28/call3``), the peak memory
    unchanged; 3 (``w`` too) took the prep kernel to 0.313 ms and forward + backward to 9.193, but on the
    H200 the bf16 case table's ``kimi`` then missed fla's bar in ``dA_log`` (1.14e-2 against 1e-2,
    ``round28/call4/gpu_tests.log``), so it stays a variant. ``krT`` is not offered: read
    transposed, the reverse pass's step waited on that load (``benchmarks/loop_check.py``, Triton 3.9 for
    sm_90) and on the H200 it faulted (``git show dba99d1:docs/gpu/round28/call2/bench.log``). fp32 mode:
    0, the backward forms both."""
    mask = knob("BWD_FWD_OPERANDS", 1) if precision == "bf16" else 0
    if mask & ~3:
        raise KnobError(f"KDADBG_BWD_FWD_OPERANDS={mask}: expected a mask of the bits 1 and 2")
    return mask


def fuse_wu(precision: str, keep_state: bool) -> bool:
    """Whether the forward skips the w/u kernel (knob ``FWD_FUSE_WU``, bf16 mode with the fused output,
    ``recurrence.fuse_out``): the token kernel stores ``kd = kn exp(gc)`` in bf16 and the state pass forms
    ``U = INV Diag(b) (v - kd S)`` itself (``vcorr`` and ``INV vcorr``, as the spec writes them) from ``v``,
    ``b`` and ``INV``, where it read ``u = INV Diag(b) v`` (fp32) and ``w = INV Diag(b) kd`` (bf16): the w/u
    kernel's reads and writes (``INV, kn, gc, v`` in, ``w, u`` out) leave the forward for one more product
    on the state pass's chain. ``U`` moves by roundings (``kd`` in bf16 where ``w`` was; ``INV`` applied
    after the subtraction). Not with ``BWD_FWD_OPERANDS`` bit 2, whose backward reads the forward's ``w``.
    ``FWD_FUSE_WU=2``: only in a forward with no backward to follow (``keep_state`` False). With 1, ``o`` and
    the gradients keep bf16 mode's accuracy within the spread of seeds (``docs/cpu/fuse_wu_seeds.txt``: 14 seeds at
    K = V = 128; ``dA_log``, the noisiest, median ratio 0.0040 -> 0.0042)."""
    mode = knob("FWD_FUSE_WU", 0)
    if mode not in (0, 1, 2):
        raise KnobError(f"KDADBG_FWD_FUSE_WU={mode}: expected 0 (off), 1 (on) or 2 (only with no backward to follow)")
    on = (mode == 1 or (mode == 2 and not keep_state)) and precision == "bf16" and fuse_out(precision)
    if on and keep_state and bwd_fwd_operands(precision) & 2:
        raise KnobError("KDADBG_FWD_FUSE_WU=1 with KDADBG_BWD_FWD_OPERANDS bit 2: the backward would read the "
                         "forward's w, which the fused forward does not form; set one of them")
    return on


def check_inputs(q, k, v, g, beta, *, chunk_size, gate, A_log, dt_bias, h0, cu_seqlens, precision,
                 cu_seqlens_cpu=None):
    """Validate shapes, dtypes and options; returns ``(B, T, H, K, V, N, cu)`` with ``cu`` the varlen
    offsets on the host (``cu_seqlens_cpu`` when given, else read back from ``cu_seqlens``) or None."""
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
    for name, t in (("A_log", A_log if gate != "none" else None), ("dt_bias", dt_bias if gate != "none" else None),
                    ("h0", h0)):
        if t is not None:
            _expect(t.device == q.device, name, f"device {q.device} (q's)", t.device)
    cu = None
    if cu_seqlens is None:
        _expect(cu_seqlens_cpu is None, "cu_seqlens_cpu", "None without cu_seqlens", "offsets")
        N = B
    else:
        _expect(B == 1, "q", "batch size 1 with cu_seqlens", B)
        if cu_seqlens_cpu is not None:
            _expect(tuple(cu_seqlens.shape) == tuple(cu_seqlens_cpu.shape), "cu_seqlens_cpu",
                    f"the shape of cu_seqlens {tuple(cu_seqlens.shape)}", tuple(cu_seqlens_cpu.shape))
        cu = (cu_seqlens if cu_seqlens_cpu is None else cu_seqlens_cpu).detach().cpu().long()
        ok = cu.dim() == 1 and cu.numel() >= 2 and int(cu[0]) == 0 and int(cu[-1]) == T and bool(
            (cu[1:] >= cu[:-1]).all())
        if not ok:
            _expect(ok, "cu_seqlens" if cu_seqlens_cpu is None else "cu_seqlens_cpu",
                    f"non-decreasing offsets from 0 to T={T}", cu.tolist())
        N = cu.numel() - 1
    if h0 is not None:
        _expect(tuple(h0.shape) == (N, H, K, V), "h0", f"shape {(N, H, K, V)} (math layout [N,H,K,V])",
                tuple(h0.shape))
    return B, T, H, K, V, N, cu


@_device_errors
def kda_forward(q, k, v, g, beta, *, scale, chunk_size=16, gate="none", lower_bound=-5.0, qk_l2norm=True,
                beta_sigmoid=True, A_log=None, dt_bias=None, h0=None, cu_seqlens=None, precision="fp32",
                tap_plan: TapPlan | None = None, out_dtype=torch.float32, cu_seqlens_cpu=None, keep_state=True):
    """Chunked KDA forward.

    Args:
        q, k, g: ``[B, T, H, K]`` (g is the raw gate, or the natural-log decay when ``gate="none"``);
        v: ``[B, T, H, V]``; beta: ``[B, T, H]`` logits (``beta_sigmoid``) or b itself.
        A_log ``[H]``, dt_bias ``[H, K]``: gate parameters (``lower_bound`` and ``softplus`` gates).
        h0: ``[N, H, K, V]`` fp32 initial state in math layout, or None for zeros.
        cu_seqlens: ``[N + 1]`` varlen offsets (B == 1), or None (N = B).
        cu_seqlens_cpu: the same offsets on the host, if the caller has them: then nothing waits for the
            GPU (otherwise ``cu_seqlens`` is read back once).
        precision: ``"fp32"`` (exact fp32 matmuls) or ``"bf16"`` (bf16 operands, fp32 accumulation).
        tap_plan: where to write forward taps (see ``TapPlan``), or None.
        out_dtype: dtype of ``o``, rounded to nearest in the kernel (the autograd op asks for v's).
        keep_state: False when no backward will follow: then, where the state pass forms ``o`` (bf16 mode)
            and without ``tap_plan``, the per-chunk ``S`` and ``U`` are not stored (``FwdSaved.S``, ``U`` None),
            nor, with l2norm in bf16 mode, ``qn, kn`` (row scales instead:
            ``prepare.rowscale_for_inference``).

    Returns:
        ``(o [B,T,H,V] in out_dtype, ht [N,H,K,V] fp32, FwdSaved, KernelChunks)``.

    Example:
        >>> o, ht, saved, chunks = kda_forward(q, k, v, g, beta, scale=K ** -0.5, gate="lower_bound",
        ...                                    A_log=A_log, dt_bias=dt_bias, h0=h0)
    """
    B, T, H, K, V, N, cu = check_inputs(q, k, v, g, beta, chunk_size=chunk_size, gate=gate, A_log=A_log,
                                        dt_bias=dt_bias, h0=h0, cu_seqlens=cu_seqlens, precision=precision,
                                        cu_seqlens_cpu=cu_seqlens_cpu)
    chunks = KernelChunks.build(B, T, cu, chunk_size, q.device)
    if tap_plan is not None and tap_plan.window is None:
        _, _, _, seq, t, start, length = chunk_layout(B, T, cu, chunk_size)
        tap_plan.bind_window(start, length, seq, t)
    q, k, g = (x.reshape(B * T, H, K).contiguous() for x in (q, k, g))
    v = v.reshape(B * T, H, V).contiguous()
    beta = beta.reshape(B * T, H).contiguous()
    if gate != "none":
        A_log = A_log.reshape(H).float().contiguous()
        dt_bias = dt_bias.reshape(H, K).float().contiguous()
    if h0 is not None:
        h0 = h0.float().contiguous()

    fused = fuse_out(precision)
    qn, kn, gc, krT, b, w, u, gT, INV, Mqk, qd, rq, rk = kda_fwd_prepare(
        q, k, v, g, beta, chunks, scale=scale, gate=gate, lower_bound=lower_bound, qk_l2norm=qk_l2norm,
        beta_sigmoid=beta_sigmoid, A_log=A_log, dt_bias=dt_bias, precision=precision, tap_plan=tap_plan,
        store_qd=fused, keep_state=keep_state, fuse_wu=fuse_wu(precision, keep_state))
    S, U, ht, o = kda_fwd_recurrence(krT, gT, w, u, h0, chunks, precision=precision, qd=qd, Mqk=Mqk,
                                     out_dtype=out_dtype, tap_plan=tap_plan, keep_state=keep_state, v=v, b=b,
                                     INV=INV)
    o = kda_fwd_output(qn, kn, gc, v, b, Mqk, S, U, chunks, scale=scale, precision=precision,
                       tap_plan=tap_plan, out_dtype=out_dtype, o=o, rq=rq, rk=rk,
                       qk_lowp=qk_lowp_mode(precision, qk_l2norm))
    reuse = bwd_fwd_operands(precision) if keep_state and qd is not None else 0
    saved = FwdSaved(qn=qn, kn=kn, gc=gc, gT=gT, b=b, INV=INV, Mqk=Mqk, S=S, U=U, rq=rq, rk=rk,
                     qd=qd if reuse & 1 else None, w=w if reuse & 2 else None)
    return o.view(B, T, H, V), ht, saved, chunks


def _tap_plan(taps: TapSelection | None, B, T, H, K, V, cu_seqlens, cu_seqlens_cpu, chunk_size,
              device) -> TapPlan | None:
    """The tap buffers for ``taps`` over the chunks of this batch (None without taps); the offsets are
    read from ``cu_seqlens_cpu`` when given."""
    if taps is None:
        return None
    cu = cu_seqlens if cu_seqlens_cpu is None else cu_seqlens_cpu
    if cu is None:  # the window's tables (host) made once per shape and window: the plan only reads them
        plan = TapPlan.build(taps, B * cdiv(T, chunk_size), H, chunk_size, K, V, device)
        plan.window = _dense_window(B, T, chunk_size, plan.lo, plan.hi)
        return plan
    _, _, base, seq, t, start, length = chunk_layout(B, T, cu, chunk_size)
    plan = TapPlan.build(taps, int(base[-1]), H, chunk_size, K, V, device)
    plan.bind_window(start, length, seq, t)  # the forward then needs no layout of its own
    return plan


@functools.lru_cache(maxsize=16)
def _dense_window(B: int, T: int, chunk_size: int, lo: int, hi: int) -> TapWindow:
    """The tap window ``[lo, hi)`` of ``B`` sequences of ``T`` tokens (``TapWindow``). Building the chunk
    tables on the host for every call was most of a taps-on call's own host time (``benchmarks/host_time.py``)."""
    _, _, _, seq, t, start, length = chunk_layout(B, T, None, chunk_size)
    return TapWindow.of(lo, hi, chunk_size, start, length, seq, t)


def _value_group(q, v) -> int:
    """Value heads per q/k head (GVA, fla's ``num_v_heads > num_heads``): ``v.shape[2] // q.shape[2]``."""
    _expect(q.dim() == 4, "q", "shape [B, T, H, K]", tuple(q.shape))
    _expect(v.dim() == 4 and v.shape[2] % q.shape[2] == 0, "v",
            f"shape [B, T, HV, V] with HV a multiple of H={q.shape[2]}", tuple(v.shape))
    return v.shape[2] // q.shape[2]


def _expand_groups(x, G: int):
    """q or k ``[B,T,H,K]`` -> ``[B,T,H*G,K]``: value head ``hv`` reads q/k head ``hv // G``."""
    return x.repeat_interleave(G, dim=2) if G > 1 else x


def _reduce_groups(dx, G: int):
    """dq or dk over the value heads ``[B,T,H*G,K]`` -> ``[B,T,H,K]``: the sum over each group, in float32."""
    if G == 1:
        return dx
    B, T, HV, K = dx.shape
    return dx.float().view(B, T, HV // G, G, K).sum(3)


def _to_math(state, layout: str):
    """``[N,H,V,K]`` (``vk``) or ``[N,H,K,V]`` (``kv``) -> fp32 math layout ``[N,H,K,V]``."""
    if state is None:
        return None
    if layout not in ("vk", "kv"):
        raise ValueError(f"state_layout: expected 'vk' or 'kv', found {layout!r}")
    return (state.transpose(-1, -2) if layout == "vk" else state).float().contiguous()


def _from_math(state, layout: str):
    return state.transpose(-1, -2).contiguous() if layout == "vk" else state


@_device_errors
def kda_forward_backward(q, k, v, g, beta, do, *, dht=None, h0=None, state_layout="vk", cu_seqlens=None,
                         cu_seqlens_cpu=None, A_log=None, dt_bias=None, scale, chunk_size=16, gate="none",
                         lower_bound=-5.0, qk_l2norm=True, beta_sigmoid=True, precision="fp32", taps: TapSelection | None = None):
    """Forward and backward in one call (what ``kdadbg run`` executes).

    Shapes as in :func:`kda_forward`; ``do`` is ``[B,T,H,V]``; ``h0``/``dht`` use ``state_layout``
    (``vk``: ``[N,H,V,K]``, ``kv``: ``[N,H,K,V]``); ``cu_seqlens_cpu``: as in :func:`kda_forward`.
    GVA: q, k may have H heads while v, g, beta, do, the states and the gate parameters have HV, a
    multiple of H; q and k are then repeated per value head (``hv`` reads ``hv // (HV/H)``), the kernels
    run over HV heads (so do the taps) and dq, dk are summed back over each group in float32.

    Returns:
        ``(outputs, buffers, plan)``: ``outputs`` holds fp32 ``o, ht, dq, dk, dv, dg, dbeta`` and, when
        they apply, ``dh0`` (with ``h0``) and ``dA_log, ddt_bias`` (gates with parameters), with
        ``ht``/``dh0`` in ``state_layout``; ``buffers`` maps each selected tap to its
        ``[n_sel_chunks, n_sel_heads, *shape]`` buffer (NaN where nothing was written); ``plan`` is
        the ``TapPlan`` (None without taps).

    Example:
        >>> out, taps, plan = kda_forward_backward(q, k, v, g, beta, do, h0=h0, dht=dht, scale=K ** -0.5,
        ...                                        gate="lower_bound", A_log=A_log, dt_bias=dt_bias,
        ...                                        taps=TapSelection(names=("S", "dS"), chunks=(0, 4)))
    """
    from .chunk_bwd import kda_backward

    G = _value_group(q, v)
    q, k = _expand_groups(q, G), _expand_groups(k, G)
    B, T, H, K = q.shape
    V = v.shape[-1]
    plan = _tap_plan(taps, B, T, H, K, V, cu_seqlens, cu_seqlens_cpu, chunk_size, q.device)
    opts = dict(scale=scale, gate=gate, lower_bound=lower_bound, qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid,
                A_log=A_log, dt_bias=dt_bias, precision=precision, tap_plan=plan)
    o, ht, saved, chunks = kda_forward(q, k, v, g, beta, chunk_size=chunk_size, h0=_to_math(h0, state_layout),
                                       cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, **opts)
    grads = kda_backward(saved, chunks, q, k, v, g, beta, do, _to_math(dht, state_layout),
                         has_h0=h0 is not None, **opts)
    outputs = {"o": o, "ht": _from_math(ht, state_layout), **grads}
    outputs["dq"], outputs["dk"] = _reduce_groups(outputs["dq"], G), _reduce_groups(outputs["dk"], G)
    if "dh0" in outputs:
        outputs["dh0"] = _from_math(outputs["dh0"], state_layout)
    return outputs, (plan.buffers if plan is not None else {}), plan


class ChunkKDAFunction(torch.autograd.Function):
    """Autograd op over :func:`kda_forward` / ``kda_backward``; states in math layout ``[N,HV,K,V]``.
    With GVA (v has HV = G·H heads) q, k are repeated per value head inside the op and dq, dk summed
    back over each group in float32, then rounded once to q's and k's dtypes."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens, opts, plan, needs_backward=True):
        G = _value_group(q, v)
        qx, kx = _expand_groups(q, G), _expand_groups(k, G)
        o, ht, saved, chunks = kda_forward(qx, kx, v, g, beta, h0=h0, cu_seqlens=cu_seqlens, tap_plan=plan,
                                           A_log=A_log, dt_bias=dt_bias, out_dtype=v.dtype, keep_state=needs_backward,
                                           **opts)
        if not needs_backward:  # no output requires grad: nothing to keep
            return o, ht
        ctx.save_for_backward(qx, kx, v, g, beta, A_log, dt_bias, saved.qn, saved.kn, saved.gc, saved.gT, saved.b,
                              saved.INV, saved.Mqk, saved.S, saved.U, saved.rq, saved.rk, saved.qd, saved.w)
        ctx.chunks, ctx.opts, ctx.plan, ctx.has_h0, ctx.group = chunks, opts, plan, h0 is not None, G
        ctx.set_materialize_grads(False)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        from .chunk_bwd import kda_backward

        q, k, v, g, beta, A_log, dt_bias, *rest = ctx.saved_tensors
        saved = FwdSaved(*rest)
        G = ctx.group
        if do is None:
            do = torch.zeros_like(v, dtype=torch.float32)
        opts = {n: ctx.opts[n] for n in ("scale", "gate", "lower_bound", "qk_l2norm", "beta_sigmoid", "precision")}
        # GVA: float32 gradients, so that dq, dk are rounded once, after the group sum
        grads = kda_backward(saved, ctx.chunks, q, k, v, g, beta, do, dht, A_log=A_log, dt_bias=dt_bias,
                             tap_plan=ctx.plan, has_h0=ctx.has_h0, grad_dtypes=G == 1, **opts)
        dq, dk = _reduce_groups(grads["dq"], G), _reduce_groups(grads["dk"], G)
        has_gate = ctx.opts["gate"] != "none"
        return (dq.to(q.dtype), dk.to(k.dtype), grads["dv"].to(v.dtype), grads["dg"].to(g.dtype),
                grads["dbeta"].to(beta.dtype),
                grads["dA_log"].to(A_log.dtype) if has_gate and ctx.needs_input_grad[5] else None,
                grads["ddt_bias"].reshape(dt_bias.shape).to(dt_bias.dtype)
                if has_gate and ctx.needs_input_grad[6] else None,
                grads.get("dh0"), None, None, None, None)


@_device_errors
def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
              chunk_size=16, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
              use_beta_sigmoid_in_kernel=False, lower_bound=None, A_log=None, dt_bias=None, state_v_first=False,
              precision="bf16", taps: TapSelection | None = None, cu_seqlens_cpu=None):
    """Chunked KDA with autograd, with flash-linear-attention's ``chunk_kda`` argument names.

    Defaults follow fla's: no in-kernel l2norm, gate or beta sigmoid.

    Args:
        q, k: ``[B, T, H, K]`` (L2-normalised in the kernel with ``use_qk_l2norm_in_kernel``);
            v: ``[B, T, H, V]``; beta: ``[B, T, H]`` (b itself, or logits with
            ``use_beta_sigmoid_in_kernel``). GVA as in fla: v, g, beta, the states, ``A_log [HV]`` and
            ``dt_bias [HV*K]`` may have HV heads, a multiple of q's H; value head ``hv`` reads q/k head
            ``hv // (HV/H)`` (the op repeats q, k per value head; taps are per value head).
        g: ``[B, T, H, K]`` natural-log decay, or with ``use_gate_in_kernel`` the raw gate: then
            ``gamma = -exp(A_log) softplus(g + dt_bias)``, or ``lower_bound * sigmoid(exp(A_log)
            (g + dt_bias))`` when ``lower_bound`` is given (``A_log``/``dt_bias`` default to 0).
        scale: query scale (default ``K ** -0.5``).
        initial_state: ``[N, H, K, V]`` (``[N, H, V, K]`` with ``state_v_first``) or None.
        output_final_state: also return the final state (fp32, same layout as ``initial_state``).
        cu_seqlens: ``[N + 1]`` varlen offsets, with B == 1.
        cu_seqlens_cpu: the same offsets on the host (as fla's ``cu_seqlens_cpu``): the call then never
            waits for the GPU; without it ``cu_seqlens`` is read back once per forward.
        chunk_size: 16, 32 or 64.
        precision: ``"bf16"`` (bf16 MMA operands, fp32 accumulation) or ``"fp32"`` (exact fp32 matmuls).
        taps: record taps (``TapSelection``); then a third value is returned, the ``TapPlan`` whose
            buffers the forward fills and the backward completes.

    Returns:
        ``(o [B, T, H, V] in v's dtype, final_state or None)`` (plus the ``TapPlan`` with ``taps``).

    Example:
        >>> q, k = (torch.randn(1, 256, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        >>> v = torch.randn(1, 256, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        >>> g = F.logsigmoid(torch.randn(1, 256, 4, 128, device="cuda")) / 16
        >>> beta = torch.rand(1, 256, 4, device="cuda", dtype=torch.bfloat16).sigmoid()
        >>> o, ht = chunk_kda(q, k, v, g, beta, output_final_state=True, chunk_size=64)
        >>> o.sum().backward()
    """
    B, T, _, K = q.shape
    H = v.shape[2] if v.dim() == 4 else q.shape[2]   # the value heads (GVA: a multiple of q's)
    V = v.shape[-1]
    if use_gate_in_kernel:
        gate = "softplus" if lower_bound is None else "lower_bound"
        A_log = torch.zeros(H, device=q.device) if A_log is None else A_log
        dt_bias = torch.zeros(H, K, device=q.device) if dt_bias is None else dt_bias
    else:
        gate, A_log, dt_bias = "none", None, None
    opts = dict(scale=K ** -0.5 if scale is None else scale, chunk_size=chunk_size, gate=gate,
                lower_bound=-5.0 if lower_bound is None else lower_bound, qk_l2norm=use_qk_l2norm_in_kernel,
                beta_sigmoid=use_beta_sigmoid_in_kernel, precision=precision, cu_seqlens_cpu=cu_seqlens_cpu)
    layout = "vk" if state_v_first else "kv"
    h0 = _to_math(initial_state, layout)  # differentiable: dh0 flows back through the transpose
    plan = _tap_plan(taps, B, T, H, K, V, cu_seqlens, cu_seqlens_cpu, chunk_size, q.device)
    # a backward can follow only where grad mode is on and an input requires grad: otherwise (inference,
    # torch.no_grad) the forward keeps nothing for one
    needs_backward = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, g, beta, A_log, dt_bias, initial_state))
    o, ht = ChunkKDAFunction.apply(q, k, v, g, beta, A_log, dt_bias, h0, cu_seqlens, opts, plan, needs_backward)
    final = _from_math(ht, layout) if output_final_state else None
    return (o, final, plan) if taps is not None else (o, final)
