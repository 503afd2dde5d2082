"""The peer benchmark's inputs (``shared/peer/peer_fla.py``), shared by the benchmark scripts.

``peer_inputs``: bf16 q/k/v with q, k L2-normalised, fp32 natural-log decay ``g = logsigmoid(randn) / 16``,
``beta = sigmoid(randn)`` in bf16, an upstream gradient ``do`` in bf16; B = 1, seed 0.
``setting_inputs``: those (``pregated``) or the raw inputs of the in-kernel gate settings (``SETTINGS``).
"""

from __future__ import annotations

import contextlib
import math
import os

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
    return x, cu_seqlens(lens, device), rn(1, T, H, D).to(torch.bfloat16)


def cu_seqlens(lens, device):
    """Sequence lengths -> packed ``cu_seqlens`` (int64 on ``device``); None without lengths."""
    if not lens:
        return None
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=device, dtype=torch.long)


# The three input settings the benchmarks time: fla's keyword flags for each (ours takes the same ones;
# fla also gets safe_gate=True with the lower-bound gate, as Kimi/FlashKDA settings pass it).
SETTINGS = {
    "pregated": {},
    "softplus": dict(use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                     state_v_first=True),
    "lower_bound": dict(use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                        state_v_first=True, lower_bound=-5.0),
}
FLA_ONLY = {"lower_bound": dict(safe_gate=True)}


def setting_inputs(setting: str, T: int, H: int, D: int, device, lens=None):
    """Returns ``(x, cu_seqlens, do)`` for one of ``SETTINGS``. ``pregated``: :func:`peer_inputs`. The
    in-kernel settings take raw projections as fla's ``KimiDeltaAttention`` feeds ``chunk_kda``: bf16
    ``q, k, v`` (randn, not normalised), the raw gate ``g`` (randn, bf16), beta logits (randn, bf16), and
    the layer's initialisation of the gate parameters, ``A_log = log U(1, 16)`` [H] and ``dt_bias = dt +
    log(-expm1(-dt))``, ``dt = exp(U(log 1e-3, log 1e-1))`` [H*D], both fp32; every tensor of ``x``
    requires grad (``A_log`` and ``dt_bias`` included)."""
    if setting not in SETTINGS:
        raise ValueError(f"setting: expected one of {tuple(SETTINGS)}, found {setting!r}")
    if setting == "pregated":
        return peer_inputs(T, H, D, device, lens=lens)
    gen = torch.Generator(device=device).manual_seed(0)

    def rn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    def un(lo, hi, *shape):
        return torch.rand(*shape, generator=gen, device=device, dtype=torch.float32) * (hi - lo) + lo

    dt = torch.exp(un(math.log(1e-3), math.log(1e-1), H * D))
    x = dict(q=rn(1, T, H, D).to(torch.bfloat16), k=rn(1, T, H, D).to(torch.bfloat16),
             v=rn(1, T, H, D).to(torch.bfloat16), g=rn(1, T, H, D).to(torch.bfloat16),
             beta=rn(1, T, H).to(torch.bfloat16), A_log=torch.log(un(1.0, 16.0, H)),
             dt_bias=dt + torch.log(-torch.expm1(-dt)))
    for t in x.values():
        t.requires_grad_(True)
    return x, cu_seqlens(lens, device), rn(1, T, H, D).to(torch.bfloat16)


@contextlib.contextmanager
def knob_env(assignments: dict[str, str]):
    """``KDADBG_*`` (or any) environment variables set for the calls inside, restored after: the kernels
    read their knobs at each launch, so one process can time a variant beside the defaults."""
    old = {n: os.environ.get(n) for n in assignments}
    os.environ.update(assignments)
    try:
        yield
    finally:
        for n, v in old.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


def variant_effect(variant: dict[str, str], reads: dict[str, set[int]]) -> str | None:
    """Why ``variant`` (``--ab``'s ``{KDADBG_NAME: value}``) cannot differ from the defaults it is timed beside,
    or None: every knob it sets either already reads that value there or is not read at all (``reads``: the
    baseline's ``tuning.record_reads``). Such a column would time the defaults twice (e.g. ``S_BF16=1`` in bf16
    mode, where it is the default, or ``INFER_ROWSCALE`` in a training call, which never reads it)."""
    same, unread = [], []
    for env, value in variant.items():
        name = env.removeprefix("KDADBG_")
        try:
            v = int(value)
        except ValueError:
            return None   # the knob itself refuses it (tuning.knob): not this check's to say
        if name not in reads:
            unread.append(name)
        elif reads[name] == {v}:
            same.append(f"{name}={v}")
        else:
            return None
    parts = ([f"{', '.join(same)} {'is' if len(same) == 1 else 'are'} what the defaults read here"] if same else []) \
        + ([f"{', '.join(unread)} {'is' if len(unread) == 1 else 'are'} not read here"] if unread else [])
    return "; ".join(parts) + ": this variant repeats the defaults" if parts else None


def parse_variant(text: str) -> dict[str, str]:
    """``"KDADBG_A=1,KDADBG_B=2"`` -> ``{"KDADBG_A": "1", "KDADBG_B": "2"}`` (a ``--ab`` value)."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        if not eq or not name.startswith("KDADBG_"):
            raise ValueError(f"--ab: expected KDADBG_NAME=value[,KDADBG_NAME=value...], found {part!r}")
        out[name] = value
    return out
