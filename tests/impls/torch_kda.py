"""A test-only, pure-torch KDA with fla's ``chunk_kda`` calling convention, and planted faults.

Loaded by the tool as ``--impl tests/impls/torch_kda.py:chunk_kda`` (or ``:fwd_fault`` ...).
It runs the token recurrence of ``shared/spec/kda-math.md`` §2 one token at a time, vectorised
over batch rows and heads, so plain autograd gives every gradient (q, k, v, g, beta,
initial_state, A_log, dt_bias). It imports nothing from kdadbg: it is an implementation under
test, not a reference.

Fault variants share ``chunk_kda``'s signature. The marked ones (``fwd_fault``, ``bwd_fault``,
``state_fault``, ``dstate_fault``) follow their data, not a position: a fault fires in every chunk (of the call's
own ``chunk_size`` chunking; chunk c of a sequence covers its tokens ``[c*C, (c+1)*C)``) that
holds a token whose *input* beta equals ``MARK`` for head h, and only for that sequence and head.
So a rerun on a window of chunks with the right ``initial_state`` shows the same fault.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MARK = 7.0
FAULT = 1e-2  # relative size of every planted fault


def plant_mark(beta: torch.Tensor, token, head: int) -> torch.Tensor:
    """A copy of ``beta [B,T,H]`` with ``MARK`` at ``token`` for ``head``.

    ``token`` is either an int, an index into the flattened ``B*T`` token axis (for varlen,
    B == 1, it is the flat token index), or a pair ``(b, t)``.
    Example: ``plant_mark(beta, 20, 1)`` marks the chunk holding token 20, head 1.
    """
    out = beta.detach().clone()
    if isinstance(token, tuple):
        out[token[0], token[1], head] = MARK
    else:
        out.view(-1, out.shape[-1])[token, head] = MARK
    return out


class _ScaleGrad(torch.autograd.Function):
    """Identity in the forward; the backward multiplies the incoming gradient by ``factor``."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.save_for_backward(factor)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        (factor,) = ctx.saved_tensors
        return grad * factor, None


def _spans(B, T, cu_seqlens, late_second):
    """Sequences as ``(rows, bos, eos, real_bos)``: one batched span, or one per varlen sequence."""
    if cu_seqlens is None:
        return [(slice(None), 0, T, 0)]
    if B != 1:
        raise ValueError(f"cu_seqlens: expected B == 1, found B={B}")
    cu = [int(x) for x in cu_seqlens.tolist()]
    if cu[0] != 0 or cu[-1] != T or any(a > b for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens: expected non-decreasing from 0 to T={T}, found {cu}")
    spans = []
    for n in range(len(cu) - 1):
        bos = min(cu[n] + 1, cu[n + 1]) if (late_second and n == 1) else cu[n]
        spans.append((slice(0, 1), bos, cu[n + 1], cu[n]))
    return spans


def _marked_chunks(marks, spans, C):
    """Token mask ``[B,T,H]``: tokens of every chunk that holds a marked token, per row and head."""
    out = torch.zeros_like(marks)
    for rows, bos, eos, _ in spans:
        for c0 in range(bos, eos, C):
            c1 = min(c0 + C, eos)
            out[rows, c0:c1] = marks[rows, c0:c1].any(1, keepdim=True)
    return out


def _gate(g, A_log, dt_bias, lower_bound, H, K):
    """Natural-log decay ``gamma [B,T,H,K]`` from the raw gate input (fla's two in-kernel gates)."""
    a = torch.ones(H, 1, dtype=g.dtype) if A_log is None else A_log.to(g.dtype).exp()[:, None]
    x = g if dt_bias is None else g + dt_bias.to(g.dtype).reshape(H, K)
    if lower_bound is not None:
        return lower_bound * torch.exp(F.logsigmoid(a * x))   # sigmoid whose derivative keeps its digits
    return -a * (torch.clamp(x, min=0) + torch.log1p(torch.exp(-x.abs())))  # -a * softplus(x), stable


def _kda(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, chunk_size,
         use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, lower_bound,
         A_log, dt_bias, state_v_first, fault=None):
    B, T, Hqk, K = q.shape
    H, V = v.shape[2], v.shape[-1]   # value heads (GVA: a multiple of q's; value head h reads q/k head h // G)
    if H % Hqk:
        raise ValueError(f"v: expected a head count that is a multiple of q's {Hqk}, found {H}")
    G = H // Hqk
    for name, t, want in (("k", k, (B, T, Hqk, K)), ("g", g, (B, T, H, K)), ("v", v, (B, T, H, V)),
                          ("beta", beta, (B, T, H))):
        if tuple(t.shape) != want:
            raise ValueError(f"{name}: expected shape {want}, found {tuple(t.shape)}")
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    C = int(chunk_size)
    scale = K ** -0.5 if scale is None else scale
    spans = _spans(B, T, cu_seqlens, late_second=fault == "varlen")
    N = len(spans) if cu_seqlens is not None else B
    marked = _marked_chunks(beta.detach() == MARK, spans, C) if fault in ("fwd", "bwd", "state", "dstate") \
        else None

    qf, kf, vf, gf, bf = (x.to(dt) for x in (q, k, v, g, beta))
    if G > 1:
        qf, kf = qf.repeat_interleave(G, 2), kf.repeat_interleave(G, 2)
    if fault == "bwd":
        kf = _ScaleGrad.apply(kf, 1.0 + FAULT * marked[..., None].to(dt))
    if use_qk_l2norm_in_kernel:
        qf = qf * torch.rsqrt(qf.pow(2).sum(-1, keepdim=True) + 1e-6)
        kf = kf * torch.rsqrt(kf.pow(2).sum(-1, keepdim=True) + 1e-6)
    gam = _gate(gf, A_log, dt_bias, lower_bound, H, K) if use_gate_in_kernel else gf
    alpha = gam.exp()
    b = torch.exp(F.logsigmoid(bf)) if use_beta_sigmoid_in_kernel else bf   # (as the gate's)

    state_shape = (N, H, V, K) if state_v_first else (N, H, K, V)
    if initial_state is None:
        h0 = torch.zeros(N, H, K, V, dtype=dt)
    else:
        if tuple(initial_state.shape) != state_shape:
            raise ValueError(f"initial_state: expected shape {state_shape}, found {tuple(initial_state.shape)}")
        h0 = initial_state.to(dt)
        h0 = h0.transpose(-1, -2) if state_v_first else h0

    o_parts, finals = [], []
    for n, (rows, bos, eos, real_bos) in enumerate(spans):
        S = h0 if cu_seqlens is None else h0[n:n + 1]  # [R, H, K, V], math layout
        outs = [torch.zeros_like(vf[rows, 0]) for _ in range(real_bos, bos)]
        for t in range(bos, eos):
            S = alpha[rows, t][..., None] * S                                     # decay first
            kt = kf[rows, t]
            err = vf[rows, t] - torch.einsum("rhk,rhkv->rhv", kt, S)
            S = S + b[rows, t][..., None, None] * kt[..., None] * err[..., None, :]
            outs.append(scale * torch.einsum("rhk,rhkv->rhv", qf[rows, t], S))
            if fault == "state" and ((t - bos) % C == C - 1 or t == eos - 1):
                S = S * (1.0 + FAULT * marked[rows, t].to(dt))[..., None, None]  # leaves the chunk
            if fault == "dstate" and ((t - bos) % C == C - 1 or t == eos - 1):   # its gradient coming back
                S = _ScaleGrad.apply(S, (1.0 + FAULT * marked[rows, t].to(dt))[..., None, None])
        o_parts.append(torch.stack(outs, 1) if outs else vf[rows, :0])
        finals.append(S)
    o = torch.cat(o_parts, 1)
    if fault == "fwd":
        o = o + (FAULT * o).detach() * marked[..., None].to(dt)  # values scaled, gradients clean
    ht = None
    if output_final_state:
        ht = torch.cat(finals, 0)
        ht = (ht.transpose(-1, -2) if state_v_first else ht).contiguous()
        ht = ht if dt == torch.float64 else ht.float()
    return o.to(torch.bfloat16 if fault == "bf16_out" else v.dtype), ht


def _entry(fault):
    def fn(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
           cu_seqlens=None, chunk_size=64, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
           use_beta_sigmoid_in_kernel=False, lower_bound=None, A_log=None, dt_bias=None,
           state_v_first=False, **kw):
        state_v_first = state_v_first or bool(kw.get("transpose_state_layout", False))
        args = (q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, chunk_size,
                use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, lower_bound,
                A_log, dt_bias, state_v_first)
        if fault == "no_grad":
            with torch.no_grad():
                return _kda(*args)
        return _kda(*args, fault=fault)
    return fn


chunk_kda = _entry(None)
chunk_kda.__doc__ = """KDA forward, fla's ``chunk_kda`` convention; returns ``(o, final_state)``.

q, k, g: [B,T,H,K] (g: natural-log decay, or the raw gate input with ``use_gate_in_kernel``:
``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` if ``lower_bound`` is given, else
``-exp(A_log) * softplus(g + dt_bias)``); v: [B,T,H,V]; beta: [B,T,H] (logits with
``use_beta_sigmoid_in_kernel``); initial_state: [N,H,K,V] ([N,H,V,K] with ``state_v_first``);
cu_seqlens: [N+1] (B == 1); A_log: [H]; dt_bias: [H,K] or [H*K]. GVA as in fla: v, g, beta, the
states, A_log and dt_bias may have HV heads, a multiple of q's and k's H (value head hv reads q/k
head hv // (HV/H)). Computes in float32 (float64
for float64 q); o comes back in v's dtype, final_state (None unless ``output_final_state``) in
float32 (float64 for float64 q) and the requested layout. ``chunk_size`` only places the faults.
Example: ``o, ht = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)``.
"""

fwd_fault = _entry("fwd")
fwd_fault.__doc__ = """o of every token of a marked chunk, marked head, is ``o + 1e-2 * o`` (the
added term is detached, so every gradient is exactly the clean function's). final_state is clean."""

bwd_fault = _entry("bwd")
bwd_fault.__doc__ = """Outputs exact; dk of the marked chunk's tokens, marked head, times 1 + 1e-2
(an identity ``autograd.Function`` on k, after the cast, scales the rows of its incoming gradient).
Every other gradient is clean."""

state_fault = _entry("state")
state_fault.__doc__ = """The state leaving a marked chunk (marked head) is multiplied by 1 + 1e-2:
the marked chunk's o is right, every later chunk of that sequence is wrong, and if the marked chunk
is the sequence's last, final_state is (the state follows its data whether a chunk or the caller
reads it next). Gradients are autograd's of this faulted function."""

dstate_fault = _entry("dstate")
dstate_fault.__doc__ = """Outputs exact; the gradient of the state leaving a marked chunk (marked head), on its
way back into that chunk, is multiplied by 1 + 1e-2 (an identity ``autograd.Function`` on the state): the
gradients of the marked chunk and of every earlier chunk of that sequence are wrong, dh0 too."""

varlen_fault = _entry("varlen")
varlen_fault.__doc__ = """With cu_seqlens and N >= 2, sequence 1 is read from ``cu_seqlens[1] + 1``
to its real end: its first token's o is 0 and it starts from its initial state one token late.
Without cu_seqlens (or with N == 1) it is the clean function. No mark needed."""

forward_only = _entry("no_grad")
forward_only.__doc__ = """The clean function run under ``torch.no_grad()``: right values, no grad_fn,
so an implementation that provides no gradients."""

bf16_out = _entry("bf16_out")
bf16_out.__doc__ = """No fault: computes in float32 as ``chunk_kda`` and returns o in bfloat16 (as a production
kernel stores it), so that its backward receives do in bfloat16."""
