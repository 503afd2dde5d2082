"""Tolerances on fla's ratio ``RMS(ref - x) / (RMS(ref) + 1e-8)``, per precision mode: the one place
they live. ``fp32``: fp32 dot operands, every tensor 1e-5. ``bf16``: bf16 dot operands, fla's KDA
test thresholds (``dA_log`` tightened from fla's warning-only 3e-3 is not attempted: 1e-2)."""

from __future__ import annotations

from .errors import KdadbgError

TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {name: 1e-5 for name in ("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias")},
    "bf16": {"o": 5e-3, "ht": 5e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dh0": 8e-3,
             "dg": 2e-2, "dbeta": 2e-2, "ddt_bias": 8e-3, "dA_log": 1e-2},
}


def tolerances(precision: str, overrides: list[str] | None = None) -> dict[str, float]:
    """The table for ``precision`` with ``NAME=VALUE`` overrides applied."""
    if precision not in TOLERANCES:
        raise KdadbgError(f"--precision: expected one of {', '.join(TOLERANCES)}, found {precision!r}")
    table = dict(TOLERANCES[precision])
    for item in overrides or ():
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in table:
            raise KdadbgError(f"--tol: expected NAME=VALUE with NAME one of {', '.join(table)}, found {item!r}")
        try:
            table[name] = float(value)
        except ValueError:
            raise KdadbgError(f"--tol {name}: expected a number, found {value!r}") from None
        if not table[name] >= 0:
            raise KdadbgError(f"--tol {name}: expected a non-negative number, found {value!r}")
    return table
