"""The noise floor: how far a correct implementation at the kernels' precision may drift from float64.

The floor of a tap × chunk × head cell is the error of the *same chunked reference* run in float32
(and, for ``--precision bf16``, with every matrix product's operands rounded to bfloat16) against
the float64 reference: the error the algorithm makes in that precision with no bug at all.

A cell over its tolerance is then labelled

* ``DRIFT`` when ``ratio <= K_DRIFT * floor + DRIFT_ABS`` (``K_DRIFT = 10``, ``DRIFT_ABS = 1e-6``
  in ratio units, so that a floor of 0 does not turn a rounding-level ratio into a bug), or when
  it is non-finite and the floor run is non-finite in the same cell (an overflow the precision
  itself cannot avoid);
* ``BUG`` otherwise;
* ``UNREP`` (never a divergence, never a failure) when the compared precision cannot hold the value
  at all: a tap carrying ``exp(-gc)`` (``ki``, ``dqd``, ``dkd``) in a chunk where ``-gc`` exceeds
  ln(max float32) ≈ 88.7 (real gates reach it: fla's softplus init at chunk 64 sums to about -100).
  Such a cell is counted and shown with its reason; it cannot find a bug, so it never leads. The same
  holds for a failing cell of those taps whose floor is itself over the tolerance: the precision cannot
  hold that cell to its tolerance (``compare.cells.judge``).

A cell's floor is raised to at least the median floor of its quantity over the compared cells
(``compare.cells.robust_floor``): one run's error in one cell is a noisy sample. Where cells fail
against that floor, the diff draws a second sample (the float32 reference of the inputs moved by one
float32 ulp at random, :func:`perturbed`) and each cell's floor is the larger of the two: two correct
float32 runs differ by more than 10x in a few cells of thousands (measured on ``kimi`` at T 512, H 4 over
8 seeds, dg rows: the kernel's ratio to its single floor reached 13.5, median 0.8).

Any failing cell whose floor is itself over its tolerance is ``UNREP`` too, for every quantity: the
same algorithm in the compared precision does not hold that cell to the tolerance, so no
implementation in it can be asked to (a ``dg`` row of a chunk whose gate gradient cancels, at chunk 16
with the lower-bound gate, has floors to 2.7e-5 in fp32 mode against its 1e-5). Outside the
exp-carrying taps a ``BUG`` (over ten times that floor) stays a ``BUG``.

``K_DRIFT = 10`` follows the flash-attention rule "kernel error <= k × same-dtype naive error +
rounding floor": a kernel may round differently from the reference model (other summation
orders, tf32 or fp16 tiles) but not by an order of magnitude more.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .config import KDAConfig, KDAInputs

OK, DRIFT, BUG, UNREP = 0, 1, 2, 3
LABELS = ("OK", "DRIFT", "BUG", "UNREP")
EXP_LIMIT_FP32 = math.log(torch.finfo(torch.float32).max)   # ≈ 88.72: exp overflows float32 beyond it
EXP_NEG_GC_TAPS = ("ki", "dqd", "dkd")                      # taps whose definition carries exp(-gc)
K_DRIFT = 10.0
DRIFT_ABS = 1e-6

DOT_DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def floor_reference(inputs: KDAInputs, config: KDAConfig, precision: str, names, device="cpu"):
    """The chunked reference in float32 (bf16 dot operands for ``bf16``): ``(outputs, taps)``, taps
    ``[n_chunks, H, *shape]``, outputs in the dump's shapes."""
    from .reference import run_reference

    res = run_reference(inputs, config, taps=names, device=device, dtype=torch.float32,
                        dot_dtype=DOT_DTYPES[precision])
    return res.outputs, res.taps


def perturbed(inputs: KDAInputs, seed: int = 1) -> KDAInputs:
    """``inputs`` with every float value moved at random one float32 ulp up, one down, or kept: the same
    problem as float32 sees it, rounded another way. The float32 reference of these, against the float64
    reference of ``inputs``, is a second sample of the error a correct float32 run makes: a cell's floor
    is one noisy sample, and where a cell fails its first floor the diff takes the larger of the two."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in KDAInputs.TENSORS:
        t = getattr(inputs, name)
        if t is None or not t.is_floating_point():
            out[name] = t
            continue
        x = t.detach().to(torch.float32)
        step = torch.randint(-1, 2, x.shape, generator=gen).to(x.device)
        up, down = torch.nextafter(x, torch.full_like(x, math.inf)), torch.nextafter(x, torch.full_like(x, -math.inf))
        out[name] = torch.where(step > 0, up, torch.where(step < 0, down, x))
    return dataclasses.replace(inputs, **out)


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


def chunks_past_exp_range(inputs: KDAInputs, config: KDAConfig, table) -> list[int]:
    """The chunks (of ``table``) whose cumulative gate, formed in float64 from the dump, passes float32's exp
    range somewhere (``-gc > EXP_LIMIT_FP32``): there ``exp(-gc)``, which the chunked algorithm's ``ki``,
    ``dqd``, ``dkd`` carry, is infinite in float32, in any kernel that forms it (ours, fla's)."""
    from .reference import activate

    with torch.no_grad():
        gam = activate(inputs, config, torch.float64, "cpu")[1]["gam"]            # [BT, HV, K]
        idx, valid = table.token_index()
        gc = torch.where(valid[..., None, None], gam[idx], 0.0).cumsum(1)           # [NC, C, HV, K]
        over = (-gc).amax(dim=(1, 2, 3)) > EXP_LIMIT_FP32
    return over.nonzero().flatten().tolist()
