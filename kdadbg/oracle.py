"""The token-by-token float64 oracle (spec §2), gradients by autograd.

Written independently of :mod:`kdadbg.reference` (no shared helpers) so that the two check each
other: one sequence at a time, one token at a time, the state in math layout ``[K, V]``.
"""

from __future__ import annotations

import torch

from .config import KDAConfig, KDAInputs



def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    """σ(x) in two branches, ``1 / (1 + e^-x)`` for x >= 0 and ``e^x / (1 + e^x)`` below, so that autograd's
    derivative (``e^-|x| / (1 + e^-|x|)^2``) keeps its digits where σ saturates; ``torch.sigmoid``'s,
    σ (1 - σ), loses them in float64 beyond x ≈ 10 (0.1 % at x = 30) and is 0 beyond 37. A formula apart
    from the reference's (``exp(logsigmoid(x))``), as the rest of this recurrence is."""
    pos = 1.0 / (1.0 + torch.exp(-x.clamp(min=0)))
    e = torch.exp(x.clamp(max=0))
    return torch.where(x >= 0, pos, e / (1.0 + e))

def oracle_forward(q, k, v, g, beta, h0, A_log, dt_bias, cu, cfg: KDAConfig):
    """Outputs ``o [B,T,HV,V]`` and ``ht [N,HV,K,V]`` (math layout) from float64 leaves; q, k
    ``[B,T,H,K]`` with ``H`` dividing ``HV`` (GVA: value head ``hv`` reads q/k head ``hv // (HV/H)``)."""
    HV = v.shape[2]
    G = HV // q.shape[2]
    if G > 1:
        q = q.repeat_interleave(G, dim=2)
        k = k.repeat_interleave(G, dim=2)
    B, T, H, K = q.shape
    if cfg.qk_l2norm:
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
    if cfg.gate == "lower_bound":
        gam = cfg.lower_bound * _sigmoid(A_log.exp()[:, None] * (g + dt_bias))
    elif cfg.gate == "softplus":
        gam = -A_log.exp()[:, None] * torch.log1p(torch.exp(-(g + dt_bias).abs())) \
            - A_log.exp()[:, None] * torch.clamp(g + dt_bias, min=0)
    else:
        gam = g
    b = _sigmoid(beta) if cfg.beta_sigmoid else beta
    if cu is None:
        spans = [(n, 0, T) for n in range(B)]
    else:
        spans = [(0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)]
    outs, finals = [], []
    for n, (row, bos, eos) in enumerate(spans):
        S = h0[n]  # [H, K, V]
        for t in range(bos, eos):
            S = torch.exp(gam[row, t])[..., None] * S                     # decay first
            kt = k[row, t]
            pred = torch.einsum("hk,hkv->hv", kt, S)
            S = S + b[row, t][:, None, None] * kt[..., None] * (v[row, t] - pred)[:, None, :]
            outs.append(((row, t), cfg.scale * torch.einsum("hk,hkv->hv", q[row, t], S)))
        finals.append(S)
    o = torch.zeros(B, T, H, v.shape[-1], dtype=q.dtype)
    o = o.index_put(
        (torch.tensor([r for (r, _), _ in outs], dtype=torch.long),
         torch.tensor([t for (_, t), _ in outs], dtype=torch.long)),
        torch.stack([x for _, x in outs])) if outs else o
    return o, torch.stack(finals)


def run_oracle(inputs: KDAInputs, cfg: KDAConfig) -> dict[str, torch.Tensor]:
    """Outputs and gradients (same names and layouts as :func:`kdadbg.reference.run_reference`)."""
    B, T, _, K, V = inputs.shape
    H, N = inputs.HV, inputs.n_seqs
    leaf = {}
    for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias"):
        t = getattr(inputs, name)
        leaf[name] = None if t is None else t.detach().double().requires_grad_(True)
    vk = cfg.state_layout == "vk"
    h0_in = inputs.h0.double() if inputs.h0 is not None else torch.zeros(N, H, K, V, dtype=torch.float64)
    if inputs.h0 is not None and vk:
        h0_in = h0_in.transpose(-1, -2)
    h0 = h0_in.contiguous().requires_grad_(True)
    o, ht = oracle_forward(leaf["q"], leaf["k"], leaf["v"], leaf["g"], leaf["beta"], h0,
                           leaf["A_log"], leaf["dt_bias"], inputs.cu_seqlens, cfg)
    loss = (o * inputs.do.double()).sum()
    if inputs.dht is not None:
        dht = inputs.dht.double()
        loss = loss + (ht * (dht.transpose(-1, -2) if vk else dht)).sum()
    wrt = {"dq": leaf["q"], "dk": leaf["k"], "dv": leaf["v"], "dg": leaf["g"], "dbeta": leaf["beta"]}
    if inputs.h0 is not None:
        wrt["dh0"] = h0
    if cfg.gate != "none":
        wrt["dA_log"], wrt["ddt_bias"] = leaf["A_log"], leaf["dt_bias"]
    grads = torch.autograd.grad(loss, list(wrt.values()), allow_unused=True)
    out = {"o": o.detach(), "ht": (ht.transpose(-1, -2) if vk else ht).detach().contiguous()}
    for (name, t), gr in zip(wrt.items(), grads):
        gr = torch.zeros_like(t) if gr is None else gr
        out[name] = gr.transpose(-1, -2).contiguous() if (name == "dh0" and vk) else gr
    return out
