"""Tolerances on fla's ratio ``RMS(ref - x) / (RMS(ref) + 1e-8)``, per precision mode: the one place
they live, for whole tensors (``kdadbg run``) and for taps (``kdadbg diff``).

Tensors: ``fp32`` (fp32 dot operands) 1e-5 for every tensor; ``bf16`` (bf16 dot operands) fla's KDA
test thresholds, with ``dA_log`` (warning-only at 3e-3 in fla) at 1e-2. Taps, per chunk and head:
``fp32`` 3e-5 forward, 5e-5 backward; ``bf16`` 5e-3 forward, 2e-2 backward.
"""

from __future__ import annotations

from kdadbg_kernels.taps import REGISTRY, STAGES, TAP_NAMES

from .errors import KdadbgError
from .selection import _did_you_mean

TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {name: 1e-5 for name in ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias")},
    "bf16": {"o": 5e-3, "ht": 5e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dh0": 8e-3,
             "dg": 2e-2, "dbeta": 2e-2, "ddt_bias": 8e-3, "dA_log": 1e-2},
}

TAP_TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {n: (3e-5 if REGISTRY[n].stage.startswith("fwd") else 5e-5) for n in TAP_NAMES},
    "bf16": {n: (5e-3 if REGISTRY[n].stage.startswith("fwd") else 2e-2) for n in TAP_NAMES},
}


ROWS = tuple(TOLERANCES["fp32"])   # the outputs and gradients, whole tensors and diff's output rows


def _with_overrides(tables: dict, precision: str, overrides, expand, names: str, known=()) -> dict[str, float]:
    """``tables[precision]`` with ``NAME=VALUE`` overrides; ``expand(name)`` lists what NAME sets; ``known``:
    every name ``--tol`` takes, for a did-you-mean."""
    if precision not in tables:
        raise KdadbgError(f"--precision: expected one of {', '.join(tables)}, found {precision!r}")
    table = dict(tables[precision])
    for item in overrides or ():
        name, sep, value = item.partition("=")
        name = name.strip()
        targets = expand(name, table)
        if not sep or not targets:
            hint = _did_you_mean(name, known) if sep else ""
            raise KdadbgError(f"--tol: expected NAME=VALUE with NAME {names}, found {item!r}{hint}")
        try:
            tol = float(value)
        except ValueError:
            raise KdadbgError(f"--tol {name}: expected a number, found {value!r}") from None
        if not tol >= 0:
            raise KdadbgError(f"--tol {name}: expected a non-negative number, found {value!r}")
        table.update({n: tol for n in targets})
    return table


def tolerances(precision: str, overrides: list[str] | None = None) -> dict[str, float]:
    """Whole-tensor tolerances for ``precision`` with ``NAME=VALUE`` overrides."""
    return _with_overrides(TOLERANCES, precision, overrides,
                           lambda name, table: [name] if name in table else [],
                           "one of " + ", ".join(ROWS), ROWS)


def tap_tolerances(precision: str, overrides: list[str] | None = None) -> dict[str, float]:
    """Per-cell tap tolerances for ``precision`` with ``NAME=VALUE`` overrides (NAME a tap or a stage; ``kdadbg
    diff`` sends the outputs' and gradients' names to :func:`tolerances`, so a name none of these takes is
    refused naming all three kinds)."""
    return _with_overrides(TAP_TOLERANCES, precision, overrides,
                           lambda name, table: [name] if name in table else
                           [n for n in TAP_NAMES if REGISTRY[n].stage == name],
                           f"a tap, a stage ({', '.join(STAGES)}) or an output or gradient ({', '.join(ROWS)})",
                           (*TAP_NAMES, *STAGES, *ROWS))
