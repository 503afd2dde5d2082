"""Error metrics, all computed in float64.

``ratio`` is flash-linear-attention's ``RMS(ref - x) / (RMS(ref) + 1e-8)``; a tensor also passes
outright when ``max|ref - x| <= 1e-6`` (fla's rule); any NaN/Inf in ``x`` fails.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

ABS_PASS = 1e-6


@dataclass
class Compare:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    max_index: tuple[int, ...]
    ratio: float
    cosine: float
    nonfinite: int
    kernel: float       # value of x at max_index
    reference: float    # value of ref at max_index
    tol: float | None = None
    passed: bool | None = None

    def judge(self, tol: float) -> "Compare":
        self.tol = tol
        self.passed = self.nonfinite == 0 and (self.max_abs <= ABS_PASS or self.ratio <= tol)
        return self

    def as_dict(self) -> dict:
        d = asdict(self)
        d["shape"], d["max_index"] = list(self.shape), list(self.max_index)
        return d


def compare(name: str, x: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor | None = None) -> Compare:
    """Compare ``x`` to ``ref`` (same shape) over the elements where ``mask`` (broadcastable) is true.

    NaN/Inf in ``x`` count as ``nonfinite`` and make the ratio infinite; the worst element is the
    first non-finite one if any, else the largest absolute error.
    """
    if tuple(x.shape) != tuple(ref.shape):
        raise ValueError(f"{name}: shape {tuple(x.shape)} != reference {tuple(ref.shape)}")
    r64 = ref.detach().double()
    x64 = x.detach().to(device=r64.device, dtype=torch.float64)   # computed where the reference lives
    m = torch.ones_like(r64, dtype=torch.bool) if mask is None else mask.to(r64.device).expand_as(r64)
    n = int(m.sum())
    if n == 0:
        return Compare(name, tuple(ref.shape), 0.0, (), 0.0, 1.0, 0, 0.0, 0.0)
    zero = torch.zeros((), dtype=torch.float64, device=r64.device)
    bad = m & ~torch.isfinite(x64)
    nonfinite = int(bad.sum())
    err = torch.where(m & ~bad, x64 - r64, zero)
    score = torch.where(bad, torch.full_like(r64, float("inf")), err.abs())
    score = torch.where(m, score, torch.full_like(r64, -1.0))
    flat = int(torch.argmax(score))
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(r64.shape)))
    rm = torch.where(m, r64, zero)
    rms_ref = (rm.pow(2).sum() / n).sqrt().item()
    ratio = float("inf") if nonfinite else (err.pow(2).sum() / n).sqrt().item() / (rms_ref + 1e-8)
    xm = torch.where(m & ~bad, x64, zero)
    denom = (xm.norm() * rm.norm()).item()
    cosine = (xm * rm).sum().item() / denom if denom > 0 else float(bool(xm.norm() == rm.norm()))
    max_abs = float("inf") if nonfinite else float(err.abs().reshape(-1)[flat])
    return Compare(name, tuple(ref.shape), max_abs, index, ratio, cosine, nonfinite,
                   float(x64.reshape(-1)[flat]), float(r64.reshape(-1)[flat]))
