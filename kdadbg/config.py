"""KDA configuration and input bundle shared by the loader, the reference and the kernels.

Config keys (dump format v1, stored as strings in the safetensors ``__metadata__``):

=============  ==========================================================  ======================
key            meaning                                                     default
=============  ==========================================================  ======================
scale          query scale                                                 ``K ** -0.5``
chunk_size     16, 32 or 64                                                16
gate           ``none`` | ``lower_bound`` | ``softplus``                   lower_bound if A_log
lower_bound    lower bound of the ``lower_bound`` gate                     -5
qk_l2norm      L2-normalise q and k                                        true
beta_sigmoid   apply a sigmoid to the beta logits                          true
state_layout   ``vk`` (h0/ht/dht/dh0 are [N,H,V,K]) or ``kv`` ([N,H,K,V])  vk
=============  ==========================================================  ======================

With grouped value heads (GVA) the states have the value heads HV where this table says H.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import torch

from .errors import KdadbgError

GATES = ("none", "lower_bound", "softplus")
LAYOUTS = ("vk", "kv")
CHUNK_SIZES = (16, 32, 64)
CONFIG_KEYS = ("scale", "chunk_size", "gate", "lower_bound", "qk_l2norm", "beta_sigmoid", "state_layout")

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


@dataclass(frozen=True)
class KDAConfig:
    scale: float
    chunk_size: int = 16
    gate: str = "none"
    lower_bound: float = -5.0
    qk_l2norm: bool = True
    beta_sigmoid: bool = True
    state_layout: str = "vk"

    def __post_init__(self):
        if self.chunk_size not in CHUNK_SIZES:
            raise KdadbgError(f"config chunk_size: expected one of {CHUNK_SIZES}, found {self.chunk_size}")
        if self.gate not in GATES:
            raise KdadbgError(f"config gate: expected one of {GATES}, found {self.gate!r}")
        if self.state_layout not in LAYOUTS:
            raise KdadbgError(f"config state_layout: expected one of {LAYOUTS}, found {self.state_layout!r}")

    def to_metadata(self) -> dict[str, str]:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = ("true" if v else "false") if isinstance(v, bool) else str(v)
        return out

    def as_dict(self) -> dict:
        return asdict(self)

    def with_overrides(self, **kw) -> "KDAConfig":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


def value_problem(key: str, value: float) -> str | None:
    """What a number-valued config key must be, when ``value`` is not that (None when it is fine)."""
    if key == "scale" and not (math.isfinite(value) and value > 0):
        return "a finite number > 0"
    if key == "lower_bound" and not (math.isfinite(value) and value < 0):
        return "a finite number < 0 (the most negative log-decay a step can take)"
    return None


def parse_config(meta: dict[str, str], K: int, has_A_log: bool, where: str = "dump") -> KDAConfig:
    """Build a config from ``__metadata__`` strings, filling the documented defaults.

    Unknown keys are ignored (dumps may carry notes); malformed values raise ``KdadbgError``.
    Keyword values (gate, state_layout, booleans) are read without regard to case.
    """
    def bad(key, expected, found):
        return KdadbgError(f"{where}: config {key}: expected {expected}, found {found!r}")

    def as_float(key, default):
        if key not in meta:
            return default
        try:
            value = float(meta[key])
        except ValueError:
            raise bad(key, "a number", meta[key]) from None
        problem = value_problem(key, value)
        if problem:
            raise bad(key, problem, meta[key])
        return value

    def as_bool(key, default):
        if key not in meta:
            return default
        s = meta[key].strip().lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
        raise bad(key, "true or false", meta[key])

    def as_choice(key, choices, default):
        if key not in meta:
            return default
        s = meta[key].strip().lower()
        if s not in choices:
            raise bad(key, "one of " + ", ".join(choices), meta[key])
        return s

    if K < 1:
        raise KdadbgError(f"{where}: head dim K: expected at least 1, found {K}")
    chunk = meta.get("chunk_size", "16")
    try:
        chunk_size = int(chunk)
    except ValueError:
        raise bad("chunk_size", "16, 32 or 64", chunk) from None
    if chunk_size not in CHUNK_SIZES:
        raise bad("chunk_size", "16, 32 or 64", chunk)
    return KDAConfig(
        scale=as_float("scale", K ** -0.5),
        chunk_size=chunk_size,
        gate=as_choice("gate", GATES, "lower_bound" if has_A_log else "none"),
        lower_bound=as_float("lower_bound", -5.0),
        qk_l2norm=as_bool("qk_l2norm", True),
        beta_sigmoid=as_bool("beta_sigmoid", True),
        state_layout=as_choice("state_layout", LAYOUTS, "vk"),
    )


def qk_heads(value_heads, group: int) -> list[int]:
    """The q/k heads that the value heads ``value_heads`` read (``hv // group``), in order, each once."""
    return sorted({int(h) // group for h in value_heads})


@dataclass
class KDAInputs:
    """Tensors of one dump, in the dump's shapes and dtypes.

    q, k: [B,T,H,K]; g: [B,T,HV,K]; v, do: [B,T,HV,V]; beta: [B,T,HV]; h0, dht: [N,HV,V,K] (``vk``)
    or [N,HV,K,V] (``kv``); cu_seqlens: [N+1] int (B == 1); A_log: [HV]; dt_bias: [HV,K] (fla's flat
    [HV*K] is viewed as [HV,K] here, so a dump may store either).

    H counts the q/k heads and HV the value heads (fla's ``num_v_heads``), a multiple of H: GVA when
    HV > H, and value head ``hv`` reads q/k head ``hv // group`` (``group = HV // H``). Everything the
    recurrence carries (states, taps, o, dv, dg, dbeta, dA_log, ddt_bias) is per value head; dq and dk
    are per q/k head, each the sum over its group's value heads.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    do: torch.Tensor
    dht: torch.Tensor | None = None
    h0: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    A_log: torch.Tensor | None = None
    dt_bias: torch.Tensor | None = None

    TENSORS = ("q", "k", "v", "g", "beta", "do", "dht", "h0", "cu_seqlens", "A_log", "dt_bias")

    def __post_init__(self):
        if self.dt_bias is not None and self.dt_bias.ndim == 1 and self.q.ndim == 4 and self.v.ndim == 4:
            HV, K = self.v.shape[2], self.q.shape[3]
            if self.dt_bias.numel() == HV * K:
                self.dt_bias = self.dt_bias.reshape(HV, K)

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """``(B, T, H, K, V)`` with H the q/k heads (see :attr:`HV` for the value heads)."""
        B, T, H, K = self.q.shape
        return B, T, H, K, self.v.shape[-1]

    @property
    def HV(self) -> int:
        """Value heads: the heads of v, g, beta, do, the states, the taps and every per-head output."""
        return self.v.shape[2]

    @property
    def group(self) -> int:
        """Value heads per q/k head (``HV // H``; 1 without GVA)."""
        return self.v.shape[2] // self.q.shape[2]

    @property
    def n_seqs(self) -> int:
        return self.q.shape[0] if self.cu_seqlens is None else self.cu_seqlens.numel() - 1

    def items(self):
        for name in self.TENSORS:
            t = getattr(self, name)
            if t is not None:
                yield name, t

    def to(self, device=None, dtype=None) -> "KDAInputs":
        """Move to ``device``; cast float tensors to ``dtype`` (cu_seqlens stays integer)."""
        out = {}
        for name, t in self.items():
            if t.is_floating_point() and dtype is not None:
                t = t.to(dtype)
            out[name] = t.to(device) if device is not None else t
        return KDAInputs(**out)
