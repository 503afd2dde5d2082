"""Round 28 call 3: which kernel's results move with bf16 mode's row scales on the H200. For each case,
the forward + backward with every tap on, with the l2norm as row scales (BF16_ROWSCALE=2) and with fp32
qn, kn stored (=0), the token kernel's launch pinned (PREP_KSPLIT=0, PREP_WARPS=4); prints, per output and
tap, how many valid elements differ in their bits (padding rows zeroed)."""

import os
import sys

import torch

from kdadbg.cases import get_case, make_inputs, with_size
from kdadbg.tapsfile import zero_padding
from kdadbg_kernels import TapSelection
from kdadbg_kernels.chunk import kda_forward_backward
from kdadbg_kernels.common import chunk_layout


def run(inputs, cfg, mode):
    os.environ["KDADBG_BF16_ROWSCALE"] = mode
    x = inputs.to("cuda")
    out, taps, plan = kda_forward_backward(
        x.q, x.k, x.v, x.g, x.beta, x.do, dht=x.dht, h0=x.h0, state_layout=cfg.state_layout, cu_seqlens=x.cu_seqlens,
        A_log=x.A_log, dt_bias=x.dt_bias, scale=cfg.scale, chunk_size=cfg.chunk_size, gate=cfg.gate,
        lower_bound=cfg.lower_bound, qk_l2norm=cfg.qk_l2norm, beta_sigmoid=cfg.beta_sigmoid, precision="bf16",
        taps=TapSelection())
    return out, taps, plan


os.environ["KDADBG_PREP_KSPLIT"], os.environ["KDADBG_PREP_WARPS"] = "0", "4"
for name in sys.argv[1:]:
    case = get_case(name)
    inputs, cfg = make_inputs(with_size(case, H=min(case.H, 2)))
    (oa, ta, plan), (ob, tb, _) = run(inputs, cfg, "2"), run(inputs, cfg, "0")
    B, T = inputs.q.shape[:2]
    lengths = chunk_layout(B, T, inputs.cu_seqlens, cfg.chunk_size)[6][plan.lo:plan.hi]
    diff = [f"{n} {int((a.view(torch.int32) != ob[n].float().view(torch.int32)).sum())}/{a.numel()}"
            for n, a in ((n, t.float()) for n, t in oa.items())]
    for n in ta:
        a, b = (zero_padding(n, t[n].cpu().float(), lengths) for t in (ta, tb))
        diff.append(f"{n} {int((a.view(torch.int32) != b.view(torch.int32)).sum())}/{a.numel()}")
    print(f"{name} (C={cfg.chunk_size}, {inputs.q.dtype}, gate {cfg.gate}): " + ", ".join(diff), flush=True)
