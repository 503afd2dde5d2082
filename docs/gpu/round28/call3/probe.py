"""Round 28 call 3: do bf16 mode's row scales keep the bits on the H200? For each case, o and the final
state of the inference forward (torch.no_grad) with the l2norm as row scales (INFER_ROWSCALE=1) against
fp32 qn, kn stored (=0), the token kernel's launch pinned (PREP_KSPLIT=0, PREP_WARPS=4); then the default
inference forward against the default training forward (the split token launch at chunk 64 with the gate).
Prints how many elements differ in their bits."""

import os
import sys

import torch

from kdadbg.cases import get_case, make_inputs, with_size
from kdadbg_kernels import chunk_kda


def call(x, cfg, grad, env):
    for n, v in env.items():
        os.environ[f"KDADBG_{n}"] = v
    extra = {}
    if cfg.gate != "none":
        extra = dict(use_gate_in_kernel=True, A_log=x.A_log, dt_bias=x.dt_bias,
                     lower_bound=cfg.lower_bound if cfg.gate == "lower_bound" else None)
    leaves = {n: getattr(x, n).clone().requires_grad_(grad) for n in ("q", "k", "v", "g", "beta")}
    with torch.set_grad_enabled(grad):
        o, ht = chunk_kda(**leaves, scale=cfg.scale, initial_state=x.h0, output_final_state=True,
                          cu_seqlens=x.cu_seqlens, chunk_size=cfg.chunk_size, use_qk_l2norm_in_kernel=cfg.qk_l2norm,
                          use_beta_sigmoid_in_kernel=cfg.beta_sigmoid, state_v_first=cfg.state_layout == "vk",
                          precision="bf16", **extra)
    for n in env:
        del os.environ[f"KDADBG_{n}"]
    return o.detach().float(), ht.detach()


def ndiff(a, b):
    return f"{int((a.view(torch.int32) != b.view(torch.int32)).sum())}/{a.numel()}"


pin = {"PREP_KSPLIT": "0", "PREP_WARPS": "4"}
for name in sys.argv[1:]:
    case = get_case(name)
    inputs, cfg = make_inputs(with_size(case, H=min(case.H, 2)))
    x = inputs.to("cuda")
    rs = call(x, cfg, False, {**pin, "INFER_ROWSCALE": "1"})
    st = call(x, cfg, False, {**pin, "INFER_ROWSCALE": "0"})
    inf, tr = call(x, cfg, False, {}), call(x, cfg, True, {})
    print(f"{name} (C={cfg.chunk_size}, {inputs.q.dtype}, gate {cfg.gate}): row scales vs stored, pinned launch: "
          f"o {ndiff(rs[0], st[0])}, ht {ndiff(rs[1], st[1])}; default inference vs training: "
          f"o {ndiff(inf[0], tr[0])}, ht {ndiff(inf[1], tr[1])}", flush=True)
