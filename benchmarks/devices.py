"""The benchmark scripts' one check of the machine, made before Triton is imported: a script that needs a
CUDA GPU says so in one line and exits 2 on a machine without one, instead of ending in torch's traceback at
its first CUDA tensor; on the CPU, Triton's interpreter is turned on (Triton makes its own functions for the
compiler or the interpreter when it is imported, so later is too late)."""

from __future__ import annotations

import os
import sys

SMOKE = "--device cpu for a smoke test under the Triton interpreter (no GPU times)"


def use_device(prog: str, device: str = "cuda", cpu: str = "") -> None:
    """Exit 2 with one line on stderr when ``device`` is CUDA and torch sees no CUDA GPU. ``cpu``: how the
    script runs without one, if it does (e.g. ``--device cpu for a smoke test``), offered in that line; with
    ``device`` ``cpu``, ``TRITON_INTERPRET=1`` is set (call it before anything imports Triton)."""
    if str(device) == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        return
    import torch

    if not str(device).startswith("cuda") or torch.cuda.is_available():
        return
    print(f"{prog}: needs a CUDA GPU, and torch {torch.__version__} sees none on this machine"
          f"{'; or ' + cpu if cpu else ''}", file=sys.stderr)
    raise SystemExit(2)
