"""``--impl reference``: the float64 chunked reference judged against itself, a self-check that must
give ratio 0 everywhere (the machinery compares it like any implementation)."""

from __future__ import annotations

import torch

from kdadbg_kernels.taps import TapSelection

from ..config import KDAConfig, KDAInputs
from .base import Implementation, ImplRun


class Reference(Implementation):
    name = kind = "reference"
    provides_taps = True

    def __init__(self, precision: str = "fp32", dtype: torch.dtype = torch.float64, dot_dtype: torch.dtype | None = None):
        self.precision = precision
        self.dtype, self.dot_dtype = dtype, dot_dtype   # float32 (and bf16 dots): the noise floor's model

    def run(self, inputs: KDAInputs, config: KDAConfig, *, device: str, taps: TapSelection | None = None) -> ImplRun:
        from ..reference import run_reference

        names = taps.names if taps is not None else ()
        res = run_reference(inputs, config, taps=names, device=device, dtype=self.dtype, dot_dtype=self.dot_dtype)
        if taps is None:
            return ImplRun(res.outputs)
        H = inputs.HV   # taps are per value head
        lo, hi = taps.chunk_range(res.chunks.n_chunks)
        heads = list(taps.head_list(H))
        hi_ = torch.tensor(heads, dtype=torch.long, device=device)
        return ImplRun(res.outputs, {n: t[lo:hi].index_select(1, hi_) for n, t in res.taps.items()},
                       list(range(lo, hi)), heads)
