"""The peer benchmark's inputs (``shared/peer/peer_fla.py``), shared by the benchmark scripts.

bf16 q/k/v with q, k L2-normalised, fp32 natural-log decay ``g = logsigmoid(randn) / 16``,
``beta = sigmoid(randn)`` in bf16, an upstream gradient ``do`` in bf16; B = 1, seed 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def peer_inputs(T: int, H: int, D: int, device, lens=None, requires_grad: bool = True):
    """Returns ``(x, cu_seqlens, do)``: ``x`` maps q, k, v, g [1,T,H,D] and beta [1,T,H] (leaves that
    require grad when asked); ``cu_seqlens`` is None, or int64 offsets of ``lens`` on ``device``."""
    gen = torch.Generator(device=device).manual_seed(0)

    def rn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    x = dict(q=F.normalize(rn(1, T, H, D), dim=-1).to(torch.bfloat16),
             k=F.normalize(rn(1, T, H, D), dim=-1).to(torch.bfloat16),
             v=rn(1, T, H, D).to(torch.bfloat16),
             g=F.logsigmoid(rn(1, T, H, D)) / 16.0,
             beta=torch.sigmoid(rn(1, T, H)).to(torch.bfloat16))
    for t in x.values():
        t.requires_grad_(requires_grad)
    cu = None
    if lens:
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=device, dtype=torch.long)
    return x, cu, rn(1, T, H, D).to(torch.bfloat16)
