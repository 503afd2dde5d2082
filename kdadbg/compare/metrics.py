"""The one error metric, in float64, for whole tensors and for every chunk × head cell alike.

``ratio`` is flash-linear-attention's ``RMS(ref - x) / (RMS(ref) + 1e-8)`` over the compared
elements; a comparison passes when it is finite and ``ratio <= tol`` or ``max|ref - x| <= 1e-6``
(fla's rule), with fla's two absolute constants taken relative to the scale of what is compared:
``scale`` is the RMS of the reference over every compared element of the quantity (the whole tensor
for ``kdadbg run``; every cell of a tap or output for ``kdadbg diff``), and the rule reads
``RMS(ref - x) / (RMS(ref) + 1e-8 scale)`` and ``max|ref - x| <= 1e-6 scale`` (each at least float32's
smallest normal, 1.2e-38, below which the compared precisions hold nothing). On unit-scale data that
is fla's rule; on a dump of small values (a captured training step's ``do`` is often ~1e-6) fla's fixed
1e-6 would pass any gradient, a negated one too. A cell far smaller than its quantity's scale still
passes on the absolute rule, as fla's near-zero elements do.

A NaN/Inf on one side only makes the ratio and max abs infinite and counts in ``nonfinite``; the worst
element is then the first such one, else the largest error. Elements non-finite on both sides (from NaN
inputs) agree and are left out of ``count``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

ABS_PASS = 1e-6      # fla's absolute rule, times the compared quantity's scale
RATIO_EPS = 1e-8     # fla's ratio denominator's constant, times that scale
TINY = torch.finfo(torch.float32).tiny   # float32's smallest normal: the least floor and epsilon


def scale_of(ref: torch.Tensor, mask: torch.Tensor) -> float:
    """The scale of a quantity: the RMS of ``ref`` over its compared, finite elements (0 if none)."""
    ref = ref.detach().to(torch.float64)
    m = mask.to(ref.device).expand(ref.shape) & torch.isfinite(ref)
    n = int(m.sum())
    return float((torch.where(m, ref, 0.).pow(2).sum() / n).sqrt()) if n else 0.0


def floors(scale: float) -> tuple[float, float]:
    """``(abs_floor, eps)`` of a quantity of ``scale``: ``1e-6 scale`` and ``1e-8 scale``, each at least
    float32's smallest normal."""
    return max(ABS_PASS * scale, TINY), max(RATIO_EPS * scale, TINY)


def cell_metrics(x: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, per_cell: bool = False,
                 weight: torch.Tensor | None = None) -> dict:
    """Metrics of every ``[R, Hs]`` cell: ``x``, ``ref`` ``[R, Hs, *dims]``, ``mask`` broadcastable to them.

    Returns ``ratio, max_abs, index`` (flat index of the worst element within the cell), ``cosine``,
    ``nonfinite``, ``count`` (elements compared) and both values at the worst element, as CPU tensors
    ``[R, Hs]``, and ``scale`` and ``abs_floor`` (floats): the quantity's scale over every cell
    (:func:`scale_of`) and the absolute rule's floor it sets (:func:`floors`). Computed on ``ref``'s
    device (large GPU taps stay there).

    ``per_cell``: the rule's two constants taken relative to each cell's own scale (the RMS of its
    reference), ``abs_floor`` then a CPU tensor ``[R, Hs]``: for the taps that carry ``exp(-gc)``
    (``noise.EXP_NEG_GC_TAPS``), whose cells span dozens of orders of magnitude (``ki`` at e^88 in one
    chunk and ~1 in another), each with errors relative to its own values. Against the quantity's scale,
    a cell far below it passed on the absolute rule whatever it held (a negated ``ki`` in a tail chunk).

    ``weight`` (broadcastable to ``x``): the metrics are those of ``weight * x`` against ``weight * ref``;
    ``kernel`` and ``reference`` stay the unweighted values at the worst (weighted) element. The exp(-gc)
    taps are weighted by ``exp(gc)`` (:func:`exp_gc_weight`): within a chunk their rows span as many orders
    of magnitude as ``gc`` does, so unweighted a cell's RMS is its last rows' alone.
    """
    dev = ref.device
    x, ref = x.detach().to(dev, torch.float64), ref.detach().to(dev, torch.float64)
    R, Hs = x.shape[0], x.shape[1]
    m = mask.to(dev).expand(x.shape).reshape(R, Hs, -1)
    raw_x, raw_r = x.reshape(R, Hs, -1), ref.reshape(R, Hs, -1)
    if weight is not None:
        w = weight.to(dev, torch.float64).expand(x.shape)
        x, ref = x * w, ref * w
    xf, rf = x.reshape(R, Hs, -1), ref.reshape(R, Hs, -1)
    zero = torch.zeros((), dtype=torch.float64, device=dev)
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=dev)
    fx, fr = torch.isfinite(xf), torch.isfinite(rf)
    both = m & ~fx & ~fr          # non-finite on both sides (NaN inputs): agreed, not compared
    bad = m & (fx ^ fr)           # non-finite on one side only
    m = m & ~both
    good = m & ~bad
    count = m.sum(-1)
    n = count.clamp(min=1)
    scale = scale_of(rf, m)
    abs_floor, eps = floors(scale)
    err = torch.where(good, xf - rf, zero)
    r0 = torch.where(good, rf, zero)
    if per_cell:   # each cell's own RMS over its compared, finite reference elements
        fin = m & fr
        own = (torch.where(fin, rf, zero).pow(2).sum(-1) / fin.sum(-1).clamp(min=1)).sqrt()
        eps = (RATIO_EPS * own).clamp(min=TINY)
        abs_floor = (ABS_PASS * own).clamp(min=TINY).cpu()
    x0 = torch.where(good, xf, zero)
    nonfinite = bad.sum(-1)
    ratio = (err.pow(2).sum(-1) / n).sqrt() / ((r0.pow(2).sum(-1) / n).sqrt() + eps)
    score = torch.where(bad, inf, err.abs())
    score = torch.where(m, score, torch.tensor(-1.0, dtype=torch.float64, device=dev))
    arg = score.argmax(-1) if score.shape[-1] else torch.zeros((R, Hs), dtype=torch.long, device=dev)
    pick = (lambda t: t.gather(-1, arg[..., None])[..., 0]) if score.shape[-1] else (lambda t: zero.expand(R, Hs))
    max_abs = pick(err.abs())
    den = x0.norm(dim=-1) * r0.norm(dim=-1)   # a side all zero has no direction: cosine undefined (NaN)
    cosine = torch.where(den > 0, (x0 * r0).sum(-1) / torch.where(den > 0, den, 1.0), float("nan"))
    out = {"ratio": torch.where(nonfinite > 0, inf, ratio), "max_abs": torch.where(nonfinite > 0, inf, max_abs),
           "index": arg, "cosine": cosine, "nonfinite": nonfinite, "count": count,
           "kernel": pick(raw_x), "reference": pick(raw_r)}
    return {**{k: v.cpu() for k, v in out.items()}, "scale": scale, "abs_floor": abs_floor}


def exp_gc_weight(gc: torch.Tensor) -> torch.Tensor:
    """``exp(gc)`` in float64, the weight of the exp(-gc) taps (``ki``, ``dqd``, ``dkd``; ``gc`` the float64
    reference's, ``[R, Hs, C, K]`` as theirs): each row then at the scale at which the gradients use it
    (``dq = scale E dqd``, ``E = exp(gc)``; ``E ki = kn``), so that every row of a cell counts, not only those
    whose ``exp(-gc)`` is largest. ``gc`` below -700 is taken at -700 (float64's exp underflows near -745)."""
    return torch.exp(gc.detach().to(torch.float64).clamp(min=-700.0))


def passes(ratio, max_abs, nonfinite, tol, abs_floor: float = ABS_PASS):
    """fla's rule on metrics (floats or tensors): finite and within ``tol``, or max abs error within
    ``abs_floor`` (1e-6 times the quantity's scale, :func:`floors`)."""
    return (nonfinite == 0) & ((max_abs <= abs_floor) | (ratio <= tol))


@dataclass
class Compare:
    """One whole tensor against the reference (``kdadbg run``)."""

    name: str
    shape: tuple[int, ...]
    max_abs: float
    max_index: tuple[int, ...]
    ratio: float
    cosine: float
    nonfinite: int
    kernel: float       # value of x at max_index
    reference: float    # value of ref at max_index
    count: int = 0      # elements compared
    scale: float = 1.0  # RMS of the reference over the compared elements
    abs_floor: float = ABS_PASS   # the absolute rule's floor: 1e-6 scale (metrics.floors)
    tol: float | None = None
    passed: bool | None = None
    unrep: str | None = None   # over tol, but within what the implementation's storage dtype can hold: why
    floor: float | None = None  # judge_storage: the ratio of the reference rounded to the storage dtype
    storage: str | None = None  # judge_storage: that dtype's name
    reason: str | None = None   # why ``passed`` is None: nothing was compared
    # dA_log/ddt_bias over tol whose own sum is right (run.carry_from_dg): the exact sum of the implementation's
    # own dg against the reference (the error carried in), and the implementation's value against that sum
    carried: float | None = None
    carried_own: float | None = None
    # over tol: the same tensor from the reference at the compared precision (the noise floor, noise.floor_reference)
    precision_floor: float | None = None
    # dA_log/ddt_bias over tol whose dg error sums coherently (compare.carried.coherence): not carried in
    coherent: float | None = None
    # dA_log/ddt_bias over tol, dg returned in 16 bits, each head over tol within how far rounding that dg can move
    # its sum (run.carry_from_dg, diff.tensor_verdicts): {"dtype", "carried", "own", "heads": [{"head", "carried",
    # "own", "reach"}]} as ratios; the sum can be shown neither right nor wrong, so the noise floor's rule judges it
    sum_unchecked: dict | None = None
    # the same where some head's own error is beyond its reach: {"dtype", "heads": those heads} (a wrong sum; the
    # failure stands)
    sum_wrong: dict | None = None

    @property
    def failed(self) -> bool:
        """Over its tolerance, neither UNREP nor carried in from ``dg``: a failure."""
        return self.passed is False and not self.unrep and self.carried is None

    def judge(self, tol: float) -> "Compare":
        self.tol = tol
        self.passed = bool(passes(self.ratio, self.max_abs, self.nonfinite, tol, self.abs_floor))
        return self.judge_compared()

    def judge_compared(self) -> "Compare":
        """A tensor with no element compared (every element NaN/Inf on both sides) has no verdict:
        ``passed`` None and a ``reason``, never a pass (its ratio 0 and cosine 1 are not measurements)."""
        if not self.compared:
            self.passed = None
            self.reason = not_compared_reason(math.prod(self.shape))
        return self

    @property
    def compared(self) -> bool:
        """Whether any element was compared (``count`` > 0)."""
        return self.count > 0

    @property
    def cosine_defined(self) -> bool:
        """The cosine is over the elements finite on both sides: undefined when there is none."""
        return self.count > self.nonfinite

    def judge_storage(self, dtype: torch.dtype, floor: float, tol16: float) -> "Compare":
        """A failing tensor the implementation returned in ``dtype`` (16 bits) whose reference, rounded to
        ``dtype``, is itself over the tolerance (``floor``: that rounding's ratio) is judged at ``tol16``,
        the tolerance of bf16 mode: within it UNREP (the compared precision cannot judge values stored so;
        never a failure), over it a failure still."""
        self.floor, self.storage = floor, str(dtype).removeprefix("torch.")
        if self.passed is None:   # nothing compared: nothing to judge
            return self
        if not self.passed and floor > self.tol and bool(passes(self.ratio, self.max_abs, self.nonfinite, tol16,
                                                                               self.abs_floor)):
            self.unrep = (f"returned in {self.storage}, whose rounding alone is ratio "
                          f"{floor:.2g} against tol {self.tol:g}; within bf16 mode's tol {tol16:g}")
        return self

    def judge_precision(self, floor: float, precision: str) -> "Compare":
        """A failing tensor (over its tolerance, neither UNREP nor carried in) whose reference at the compared
        precision (``floor``: the noise floor's ratio, ``noise.floor_reference``) is itself over the tolerance
        is UNREP where it is within ``noise.K_DRIFT`` times that floor (``DRIFT_ABS`` added): the precision
        cannot hold it to its tolerance, as a diff cell's floor says (``compare.cells.judge``); further, a
        failure still. Non-finite values are never UNREP here; a tensor returned in 16 bits has the storage
        rule instead (``judge_storage``: bf16 mode's tolerance), which its callers apply first. Applied at fp32
        only: bf16 mode's noise model rounds the products' operands alone, and its ``dg`` floor reached 3.7e-2
        on a dump where bf16 kernels give 2-4e-3 (README, FlashKDA's gate gradient), too loose a bar."""
        from ..noise import DRIFT_ABS, K_DRIFT

        self.precision_floor = floor
        if (self.failed and self.nonfinite == 0 and math.isfinite(floor) and floor > self.tol
                and self.ratio <= K_DRIFT * floor + DRIFT_ABS):
            at = "float32" if precision == "fp32" else "float32 with bf16 matrix-product operands"
            self.unrep = (f"the compared precision cannot hold it to its tolerance as a whole: the reference in "
                          f"{at} (the noise floor) is ratio {floor:.3g} > tol {self.tol:g}, and this is within "
                          f"{K_DRIFT:g}x of it (kdadbg diff judges it chunk by chunk, where an error in one chunk "
                          f"stands out)")
        return self

    def as_dict(self) -> dict:
        d = asdict(self)
        d["shape"], d["max_index"] = list(self.shape), list(self.max_index)
        return d


def not_compared_reason(elements: int, name: str | None = None) -> str:
    """Why a tensor or cell with ``count`` 0 was not compared (``name``: a triangular tap's, whose structural
    zeros compare nothing: ``cells.hollow_triangles``)."""
    from .quantities import MEANINGFUL_TRIL
    if elements and name in MEANINGFUL_TRIL:
        part = "on and below its diagonal" if MEANINGFUL_TRIL[name] == 0 else "below its diagonal"
        return (f"not compared: every element {part} is NaN/Inf on both sides (the rest are the same "
                f"structural {'zeros' if name != 'INV' else 'zeros and unit diagonal'} on both)")
    return ("not compared: every element is NaN/Inf on both sides" if elements else
            "not compared: it has no element")


def compare(name: str, x: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor | None = None) -> Compare:
    """Compare ``x`` to ``ref`` (same shape) over the elements where ``mask`` (broadcastable) is true:
    the whole tensor as one cell of :func:`cell_metrics`."""
    if tuple(x.shape) != tuple(ref.shape):
        raise ValueError(f"{name}: shape {tuple(x.shape)} != reference {tuple(ref.shape)}")
    shape = tuple(ref.shape)
    x, ref = x.reshape(-1), ref.reshape(-1)
    at = None
    if mask is not None:   # only the masked elements travel to float64 (a window of a long dump)
        at = mask.to(ref.device).expand(shape).reshape(-1).nonzero().flatten()
        x, ref = x[at.to(x.device)], ref[at]
    met = cell_metrics(x.reshape(1, 1, -1), ref.reshape(1, 1, -1), torch.ones((), dtype=torch.bool))
    v = {k: t[0, 0].item() for k, t in met.items() if isinstance(t, torch.Tensor)}
    flat = int(v["index"]) if at is None or not at.numel() else int(at[int(v["index"])])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape)) if math.prod(shape) else ()
    return Compare(name, shape, float(v["max_abs"]), index, float(v["ratio"]), float(v["cosine"]),
                   int(v["nonfinite"]), float(v["kernel"]), float(v["reference"]), int(v["count"]), met["scale"],
                   met["abs_floor"])


def nonfinite_inputs(inputs) -> dict[str, int]:
    """NaN/Inf count per float input that holds any (loaded with ``--allow-nonfinite``)."""
    return {n: int((~torch.isfinite(t)).sum()) for n, t in inputs.items()
            if t.is_floating_point() and not bool(torch.isfinite(t).all())}


def nan_positions_agree(cand: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> bool:
    """Whether both sides put NaN/Inf in exactly the same elements of every output they share."""
    for n, t in cand.items():
        if n in ref:
            a, b = ~torch.isfinite(t.detach().cpu()), ~torch.isfinite(ref[n].detach().cpu())
            if a.shape != b.shape or not bool((a == b).all()):
                return False
    return True


def nonfinite_note(bad_inputs: dict[str, int], agree: bool) -> str:
    return ("the inputs hold NaN/Inf (" + ", ".join(f"{n}: {c}" for n, c in bad_inputs.items()) +
            "): this compares non-finite data, leaving out elements non-finite on both sides; " +
            ("both sides put NaN/Inf in the same output elements (outside what the inputs' NaN/Inf can reach)"
             if agree else "the two sides disagree on where the outputs are NaN/Inf outside what the inputs' "
             "NaN/Inf can reach: fail"))
