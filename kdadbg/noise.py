"""The noise floor: how far a correct implementation at the kernels' precision may drift from float64.

The floor of a tap × chunk × head cell is the error of the *same chunked reference* run in float32
(and, for ``--precision bf16``, with every matrix product's operands rounded to bfloat16) against
the float64 reference: the error the algorithm makes in that precision with no bug at all.

A cell over its tolerance is then labelled

* ``DRIFT`` when ``ratio <= K_DRIFT * floor + DRIFT_ABS`` (``K_DRIFT = 10``, ``DRIFT_ABS = 1e-6``
  in ratio units, so that a floor of 0 does not turn a rounding-level ratio into a bug), or when
  it is non-finite and the floor run is non-finite in the same cell (an overflow the precision
  itself cannot avoid);
* ``BUG`` otherwise.

``K_DRIFT = 10`` follows the flash-attention rule "kernel error <= k × same-dtype naive error +
rounding floor": a kernel may round differently from the reference model (other summation
orders, tf32 or fp16 tiles) but not by an order of magnitude more.
"""

from __future__ import annotations

import torch

from .config import KDAConfig, KDAInputs

OK, DRIFT, BUG = 0, 1, 2
LABELS = ("OK", "DRIFT", "BUG")
K_DRIFT = 10.0
DRIFT_ABS = 1e-6

DOT_DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def floor_reference(inputs: KDAInputs, config: KDAConfig, precision: str, names, device="cpu"):
    """The chunked reference in float32 (bf16 dot operands for ``bf16``): taps ``[n_chunks, H, *shape]``."""
    from .reference import run_reference

    res = run_reference(inputs, config, taps=names, device=device, dtype=torch.float32,
                        dot_dtype=DOT_DTYPES[precision])
    return res.taps


def classify(passed: torch.Tensor, ratio: torch.Tensor, nonfinite: torch.Tensor,
             floor_ratio: torch.Tensor | None = None, floor_nonfinite: torch.Tensor | None = None) -> torch.Tensor:
    """Labels (``OK``/``DRIFT``/``BUG`` as int8) of cells; without a floor every failing cell is a ``BUG``."""
    label = torch.where(passed, OK, BUG).to(torch.int8)
    if floor_ratio is None:
        return label
    drift = (nonfinite == 0) & (ratio <= K_DRIFT * floor_ratio + DRIFT_ABS)
    if floor_nonfinite is not None:
        drift |= (nonfinite > 0) & (floor_nonfinite > 0)
    return torch.where(~passed & drift, torch.tensor(DRIFT, dtype=torch.int8), label)
