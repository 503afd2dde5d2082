"""A tiny KDA model for the capture tests (and the script ``kdadbg capture`` runs in them).

Its attention calls ``kdadbg_kernels.chunk_kda`` (``impl="kernels"``) or :func:`naive_kda`, a
token-by-token pure-torch KDA with fla's ``chunk_kda`` calling convention (``impl="naive"``), through
module attributes, as training code does, so that capture can patch either.
"""

import torch
import torch.nn.functional as F
from torch import nn

H, K, D = 2, 16, 32


def naive_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              lower_bound=None, state_v_first=False, cu_seqlens=None, **kwargs):
    """fla's ``chunk_kda`` semantics in float32 autograd ops, one token at a time (no varlen)."""
    B, T, Hq, Kq = q.shape
    scale = Kq ** -0.5 if scale is None else scale
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
    if use_gate_in_kernel:
        x = g + kwargs["dt_bias"].view(Hq, Kq)
        a = kwargs["A_log"].exp()[:, None]
        g = lower_bound * torch.sigmoid(a * x) if lower_bound is not None else -a * F.softplus(x)
    b = torch.sigmoid(beta) if use_beta_sigmoid_in_kernel else beta
    S = torch.zeros(B, Hq, Kq, v.shape[-1]) if initial_state is None else (
        initial_state.transpose(-1, -2) if state_v_first else initial_state)
    outs = []
    for t in range(T):
        S = torch.exp(g[:, t])[..., None] * S
        kt = k[:, t]
        pred = torch.einsum("bhk,bhkv->bhv", kt, S)
        S = S + b[:, t, :, None, None] * kt[..., None] * (v[:, t] - pred)[:, :, None, :]
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    final = (S.transpose(-1, -2) if state_v_first else S) if output_final_state else None
    return torch.stack(outs, 1), final


def wrapper_kda(q, k, v, g, beta, **kwargs):
    """A wrapper that calls ``naive_kda`` (through this module, so a capture of both sees both calls)."""
    return naive_kda(q, k, v, g, beta, **kwargs)


def args_kda(*a, **kw):
    """A wrapper whose signature names no argument, as ``(*a, **kw)`` wrappers do; called with q, k, v, g, beta
    by position."""
    return naive_kda(*a, **kw)


class Attn(nn.Module):
    def __init__(self, impl: str, use_state: bool):
        super().__init__()
        self.impl, self.use_state = impl, use_state
        self.proj = nn.Linear(D, 4 * H * K + H)
        self.out = nn.Linear(H * K, D)
        self.A_log = nn.Parameter(torch.zeros(H).uniform_(-0.5, 0.5))
        self.dt_bias = nn.Parameter(torch.randn(H * K) * 0.1)       # fla's flat [H*K]
        self.h0 = nn.Parameter(torch.randn(1, H, K, K) * 0.1)       # [N,H,K,V], fla's default layout

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v, g, beta = self.proj(x).split([H * K] * 4 + [H], -1)
        q, k, v, g = (t.reshape(B, T, H, K) for t in (q, k, v, g))
        kw = dict(initial_state=self.h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                  use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=-5.0, A_log=self.A_log,
                  dt_bias=self.dt_bias, chunk_size=16)
        if self.impl == "wrapper":
            o, ht = wrapper_kda(q, k, v, g, beta, **kw)
        elif self.impl == "args":
            o, ht = args_kda(q, k, v, g, beta, **kw)
        elif self.impl == "kernels":
            import kdadbg_kernels

            o, ht = kdadbg_kernels.chunk_kda(q, k, v, g, beta, precision="fp32", **kw)
        else:
            o, ht = naive_kda(q, k, v, g, beta, **kw)
        self.last = (o.detach(), ht.detach())
        extra = ht.square().mean() if self.use_state else x.new_zeros(())
        return self.out(o.reshape(B, T, H * K)), extra


class Layer(nn.Module):
    def __init__(self, impl: str, use_state: bool):
        super().__init__()
        self.attn = Attn(impl, use_state)

    def forward(self, x):
        y, extra = self.attn(x)
        return x + y, extra


class TinyModel(nn.Module):
    """Two layers; only layer 0's final state enters the loss (so only its dump has ``dht``).

    ``parallel``: each layer reads the input and adds a loss term of its own, so a NaN made in one
    layer reaches no other layer's inputs or gradients (sequential layers pass it on both ways).
    """

    def __init__(self, impl: str = "naive", seed: int = 0, parallel: bool = False):
        super().__init__()
        torch.manual_seed(seed)
        self.parallel = parallel
        self.layers = nn.ModuleList([Layer(impl, use_state=i == 0) for i in range(2)])

    def forward(self, x):
        total = x.new_zeros(())
        for layer in self.layers:
            y, extra = layer(x)
            total = total + extra + (y.square().mean() if self.parallel else 0)
            x = x if self.parallel else y
        return total if self.parallel else x.square().mean() + total


def batch(T: int = 32, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, T, D, generator=gen)
