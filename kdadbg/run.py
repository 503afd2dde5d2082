"""``kdadbg run``: an implementation (``--impl``, default our kernels) forward + backward and the float64
reference on the same inputs, compared tensor by tensor (the one metric of :mod:`kdadbg.compare`).
What the implementation does not provide (a forward-only one's gradients) is listed as not provided,
never passed; an implementation that provides nothing comparable is an error."""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .compare import Compare, compare
from .compare.result import knob_overrides
from .config import KDAConfig, KDAInputs
from .errors import KdadbgError
from .fileio import atomic_save, kdadbg_version
from .impls import Implementation, check_supported, resolve_impl
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
    impl: dict = field(default_factory=dict)
    not_provided: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    knobs: dict[str, str] = field(default_factory=knob_overrides)  # KDADBG_* knob overrides in effect

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tensors)

    @property
    def elements(self) -> int:
        return sum(t.count for t in self.tensors)

    def as_json(self) -> dict:
        """The ``--json`` document (schema 2, documented in the README)."""
        return {
            "schema": 2,
            "verdict": "pass" if self.passed else "fail",
            "dump": self.dump,
            "impl": self.impl,
            "precision": self.precision,
            "device": self.device,
            "tensors": [{"name": t.name, "shape": list(t.shape), "max_abs": finite_or_none(t.max_abs),
                         "max_index": list(t.max_index), "ratio": finite_or_none(t.ratio),
                         "cosine": finite_or_none(t.cosine), "count": t.count,
                         "nonfinite": t.nonfinite, "tol": t.tol, "pass": t.passed} for t in self.tensors],
            "compared": {"tensors": len(self.tensors), "elements": self.elements},
            "not_provided": self.not_provided,
            "notes": self.notes,
            "knobs": self.knobs,
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


def check(inputs: KDAInputs, config: KDAConfig, *, impl: Implementation | None = None, dump: str = "",
          precision: str = "fp32", device: str = "cpu", tol_overrides: list[str] | None = None,
          progress: Progress | None = None, save: str | None = None, force: bool = False) -> RunResult:
    """Run ``impl`` (default: our kernels at ``precision``) and the reference on ``inputs`` and compare
    every output and gradient the implementation provides.

    ``save``: also write the implementation's outputs and gradients (float32) to this safetensors file.
    Example: ``check(*make_inputs(get_case("basic")), precision="bf16").passed``.
    """
    from .reference import run_reference

    impl = impl or resolve_impl("ours", precision)
    check_supported(impl, inputs, config, dump)
    tols = tolerances(impl.precision, tol_overrides)
    if save is not None and not force:
        from pathlib import Path
        if Path(save).exists():
            raise KdadbgError(f"{save}: already exists; refusing to overwrite (use --force)")
    timings = {}
    stage = f"{impl.name} (forward+backward)"
    if progress:
        progress(stage, 0, 1)
    t0 = time.perf_counter()
    got = impl.run(inputs, config, device=device)
    timings[impl.name] = time.perf_counter() - t0
    if progress:
        progress(stage, 1, 1)
    t0 = time.perf_counter()
    ref = run_reference(inputs, config, taps=(), device=device, progress=progress)
    timings["reference"] = time.perf_counter() - t0
    names = outputs_that_apply(inputs, config)
    rows = [compare(n, got.outputs[n], ref.outputs[n]).judge(tols[n]) for n in names if n in got.outputs]
    not_provided = {n: got.not_provided.get(n, "not returned") for n in names if n not in got.outputs}
    if not rows:
        raise KdadbgError(f"nothing to compare: --impl {impl.name} provides none of {', '.join(names)}")
    result = RunResult(dump, impl.precision, device, config, rows, timings, impl.describe(), not_provided,
                       list(got.notes))
    if save is not None:
        meta = {"source": impl.name, "precision": impl.precision, "dump": dump, "kdadbg": kdadbg_version(),
                **config.to_metadata()}
        atomic_save({r.name: got.outputs[r.name].detach().float().cpu() for r in rows}, meta, save, force=force)
    return result
