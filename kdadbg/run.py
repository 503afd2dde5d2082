"""``kdadbg run``: our kernels forward + backward and the float64 reference on the same inputs,
compared tensor by tensor."""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .backend import run_kernels
from .config import KDAConfig, KDAInputs
from .errors import KdadbgError
from .fileio import atomic_save, kdadbg_version
from .metrics import Compare, compare
from .tapsfile import outputs_that_apply
from .tolerances import tolerances

Progress = Callable[[str, int, int], None]


@dataclass
class RunResult:
    dump: str
    precision: str
    device: str
    config: KDAConfig
    tensors: list[Compare]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tensors)

    def as_json(self) -> dict:
        """The ``--json`` document (schema 1, documented in the README)."""
        return {
            "schema": 1,
            "verdict": "pass" if self.passed else "fail",
            "dump": self.dump,
            "precision": self.precision,
            "device": self.device,
            "tensors": [{"name": t.name, "shape": list(t.shape), "max_abs": finite_or_none(t.max_abs),
                         "max_index": list(t.max_index), "ratio": finite_or_none(t.ratio),
                         "cosine": finite_or_none(t.cosine),
                         "nonfinite": t.nonfinite, "tol": t.tol, "pass": t.passed} for t in self.tensors],
            "config": self.config.as_dict(),
            "env": environment(self.device),
            "timings_s": self.timings,
        }


def finite_or_none(x: float) -> float | None:
    """JSON has no Infinity/NaN: non-finite figures are written as null."""
    return x if math.isfinite(x) else None


def environment(device: str) -> dict:
    import triton

    env = {"kdadbg": kdadbg_version(), "python": platform.python_version(), "torch": torch.__version__,
           "triton": triton.__version__, "device": device}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
    else:
        env["triton_interpreter"] = True
    return env


def compare_outputs(kernel: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], names, tols: dict[str, float]
                    ) -> list[Compare]:
    rows = []
    for name in names:
        if name not in kernel:
            raise RuntimeError(f"the kernels returned no {name!r}")
        rows.append(compare(name, kernel[name], ref[name]).judge(tols[name]))
    return rows


def check(inputs: KDAInputs, config: KDAConfig, *, dump: str = "", precision: str = "fp32", device: str = "cpu",
          tol_overrides: list[str] | None = None, progress: Progress | None = None,
          save: str | None = None, force: bool = False) -> RunResult:
    """Run kernels and reference on ``inputs`` and compare every output and gradient.

    ``save``: also write the kernel outputs and gradients (float32) to this safetensors file.
    Example: ``check(*make_inputs(get_case("basic")), precision="bf16").passed``.
    """
    from .reference import run_reference

    tols = tolerances(precision, tol_overrides)
    if save is not None and not force:
        from pathlib import Path
        if Path(save).exists():
            raise KdadbgError(f"{save}: already exists; refusing to overwrite (use --force)")
    timings = {}
    if progress:
        progress("kernels (forward+backward)", 0, 1)
    t0 = time.perf_counter()
    kern, _, _ = run_kernels(inputs, config, precision, device)
    timings["kernels"] = time.perf_counter() - t0
    if progress:
        progress("kernels (forward+backward)", 1, 1)
    t0 = time.perf_counter()
    ref = run_reference(inputs, config, taps=(), device=device, progress=progress)
    timings["reference"] = time.perf_counter() - t0
    names = outputs_that_apply(inputs, config)
    result = RunResult(dump, precision, device, config, compare_outputs(kern, ref.outputs, names, tols), timings)
    if save is not None:
        meta = {"source": "kernel", "precision": precision, "dump": dump, "kdadbg": kdadbg_version(),
                **config.to_metadata()}
        atomic_save({n: kern[n].float() for n in names}, meta, save, force=force)
    return result
