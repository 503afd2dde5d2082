"""Launch parameters of the kernels, with benchmark-only overrides.

Each kernel asks ``knob(NAME, default)`` for a block size, warp count or stage count; the default is
what was chosen from ``benchmarks/kernel_resources.py`` (no register spills on sm_90) and the H200
profiles in ``docs/benchmarks.md``. Setting ``KDADBG_<NAME>`` in the environment overrides it, so that
``benchmarks/stage_bench.py`` can time variants in one GPU call without editing code. ``*_ABLATE``
knobs switch parts of a kernel off (wrong results, timing only); they are 0 in normal use, and a
non-zero one raises unless ``KDADBG_ALLOW_ABLATE=1``.
"""

from __future__ import annotations

import os


def knob(name: str, default: int) -> int:
    raw = os.environ.get(f"KDADBG_{name}")
    if raw is None:
        return default
    try:
        val = int(raw)
    except ValueError:
        raise ValueError(f"KDADBG_{name}: expected an integer, found {raw!r}") from None
    if name.endswith("_ABLATE") and val and os.environ.get("KDADBG_ALLOW_ABLATE") != "1":
        raise ValueError(f"KDADBG_{name}={val} switches kernel parts off (timing only); "
                         "set KDADBG_ALLOW_ABLATE=1 to mean it")
    return val
