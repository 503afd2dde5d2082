"""The benchmark scripts' one check of the machine: a script that needs a CUDA GPU says so in one line and
exits 2 on a machine without one, instead of ending in torch's traceback at its first CUDA tensor."""

from __future__ import annotations

import sys

SMOKE = "--device cpu for a smoke test under the Triton interpreter (no GPU times)"


def require_cuda(prog: str, device: str = "cuda", cpu: str = "") -> None:
    """Exit 2 with one line on stderr when ``device`` is CUDA and torch sees no CUDA GPU. ``cpu``: how the
    script runs without one, if it does (e.g. ``--device cpu for a smoke test``), offered in that line."""
    import torch

    if not str(device).startswith("cuda") or torch.cuda.is_available():
        return
    print(f"{prog}: needs a CUDA GPU, and torch {torch.__version__} sees none on this machine"
          f"{'; or ' + cpu if cpu else ''}", file=sys.stderr)
    raise SystemExit(2)
