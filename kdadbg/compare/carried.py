"""``dA_log`` and ``ddt_bias`` are sums over every token of one head: linear in ``dg`` with coefficients
from the inputs (spec §1.3), so an implementation's own ``dg`` determines them. Formed exactly from that
``dg``, they carry ``dg``'s error and nothing of the reduction's: where the gate gradient cancels across
the head (sqrt(sum t^2) / |sum t| = 18 for head 1 of the CI-size ``kimi`` dump at seed 0), ``dg`` well
within its bar (1e-3 of its own size against 2e-2 in bf16 mode) can put ``dA_log`` over its bar of 1e-2
(``tests/test_diff.py`` plants exactly that). Such a cell is carried in from ``dg``, which is judged on
its own rows, not a bug of the reduction. A cell's error
splits into the sum's own (the implementation's value against the exact sum of its own ``dg``) and the
part carried in (that exact sum against the reference): :func:`carried_in` relabels a BUG of these rows
DRIFT where the sum's own part is within the quantity's tolerance, and says so."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .. import noise
from .cells import Cells, compare_cells, output_rows

REDUCED = ("dA_log", "ddt_bias")


class Terms(NamedTuple):
    """``dg``'s terms in ``dA_log``/``ddt_bias`` (:func:`terms`): formed once per diff and handed to each use."""
    d: torch.Tensor   # dg [B, T, HV, K], float64 on the CPU
    c: torch.Tensor   # the coefficient of each of its terms in dA_log, the same shape


def terms(dg: torch.Tensor, inputs, config) -> Terms:
    """``dg`` [B, T, HV, K] and the coefficients ``c`` of its terms in ``dA_log`` (float64, on the CPU): ``c = g +
    dt_bias`` for the lower-bound gate, ``softplus(x) / sigmoid(x)`` (x = g + dt_bias) for softplus."""
    d = dg.detach().to(torch.float64).cpu()
    HV, K = d.shape[2], d.shape[3]
    x = inputs.g.detach().to(torch.float64).cpu() + inputs.dt_bias.detach().to(torch.float64).cpu().reshape(HV, K)
    if config.gate == "lower_bound":
        return Terms(d, x)
    # softplus(x) / sigmoid(x) -> 1 as x -> -inf (both e^x)
    return Terms(d, torch.where(x < -30, torch.ones_like(x), F.softplus(x) / torch.sigmoid(x)))


def reductions_of(dg: torch.Tensor, inputs, config, formed: Terms | None = None) -> dict[str, torch.Tensor]:
    """``dA_log`` [HV] and ``ddt_bias`` (the dump's ``dt_bias`` shape) formed in float64 from ``dg``
    [B, T, HV, K]: ``ddt_bias = sum_t dg``; ``dA_log = sum_{t,k} dg c`` (:func:`terms`; ``formed``: those of
    this ``dg``, already formed)."""
    d, c = formed or terms(dg, inputs, config)
    return {"dA_log": (d * c).sum((0, 1, 3)),
            "ddt_bias": d.sum((0, 1)).reshape(inputs.dt_bias.shape)}


# How coherently dg's error sums into dA_log/ddt_bias: |sum of its terms' errors| / sqrt(sum of their squares).
# Rounding errors partly cancel: on this project's CPU (benchmarks/coherence.py, docs/cpu/coherence.log) the
# float32 reference reaches 6.4 (dA_log, per head) and 11.5 (ddt_bias, per channel; 15.6 with bf16 products)
# on chunk64_strong at T 512, H 4; our bf16 kernels up to 7.8 and 7.3 on the kimi, kimi_c64, fla_layer and
# kimi_varlen presets, seeds 0 and 1; at T 4096-8192 the float32 reference with bf16 products 8.2 and 15.5; on an
# H100 at T 8192, H 16, K = V = 128 our bf16 kernels 11.7 and 15.2, fla's 6.3 and 14.6 (docs/gpu/round41/call3).
# A bias in dg (5e-4 of its RMS on one head) gave 90 (dA_log). Beyond
# COHERENT, at fp32 or in bf16 mode, a dA_log/ddt_bias over its bar is not excused as carried in from dg: the
# error is dg's bias, which dg's own rows (UNREP within ten times their floor, or within bf16's 2e-2) did not
# show (a user trial: a dg missing each chunk's last token passed at 0.019 in bf16 mode, dA_log 14x its
# bar excused as carried in).
COHERENT = 30.0


def coherence(dg: torch.Tensor, ref_dg: torch.Tensor, inputs, config,
              formed: Terms | None = None) -> dict[str, torch.Tensor]:
    """``{"dA_log": [HV], "ddt_bias": dt_bias's shape}``: how coherently the implementation's ``dg`` error
    (against the reference's ``ref_dg``) sums into each reduced value (``COHERENT``); NaN where no error.
    ``formed``: ``dg``'s :func:`terms`, already formed."""
    d, c = formed or terms(dg, inputs, config)
    e = d - ref_dg.detach().to(torch.float64).cpu()
    e = torch.where(torch.isfinite(e), e, torch.zeros_like(e))
    t = e * c
    return {"dA_log": _coherent(t, (0, 1, 3)), "ddt_bias": _coherent(e, (0, 1)).reshape(inputs.dt_bias.shape)}


def _coherent(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``|sum t| / sqrt(sum t^2)`` over ``dims``, at most sqrt(N) for N terms, NaN where every term is 0. Each
    group scaled by its largest term first: errors near 1e-300 squared to 0 made it inf, a coherent "bias" of a
    column that had none (a user trial: ddt_bias failed at 1.8e308 on a step with gates near -1e16)."""
    m = t.abs().amax(dims, keepdim=True)
    t = torch.where(m > 0, t / torch.where(m > 0, m, torch.ones_like(m)), torch.zeros_like(t))
    return t.sum(dims).abs() / t.pow(2).sum(dims).sqrt()


U32 = 2.0 ** -24   # float32's unit roundoff


def rounding_reach(dg: torch.Tensor, inputs, config,
                   formed: Terms | None = None) -> dict[str, tuple[torch.Tensor, int]]:
    """How far a correct float32 reduction of ``reductions_of``'s sums can land from the exact one:
    ``{name: (sum of |term| per element, number of terms N)}``; ``(2 + log2 N) u Σ|t|`` bounds a pairwise or
    blocked float32 sum's error (each term's own rounding included), which cancellation makes large beside
    ``|Σ t|`` (fla_layer_varlen, head 0: Σ|t| / |Σ t| = 261, a correct float32 dA_log 2.8e-5 off its own dg's
    exact sum, its bar 1e-5). ``formed``: ``dg``'s :func:`terms`, already formed."""
    d, c = (t.abs() for t in (formed or terms(dg, inputs, config)))
    K = d.shape[3]
    B, T = d.shape[:2]
    return {"dA_log": ((d * c).sum((0, 1, 3)), B * T * K),
            "ddt_bias": (d.sum((0, 1)).reshape(inputs.dt_bias.shape), B * T)}


# significand bits (the implicit one included) of the 16-bit dtypes an implementation may return dg or the sums in
_SIGNIFICAND = {torch.bfloat16: 8, torch.float16: 11}
# How many standard deviations of dg's 16-bit rounding the sum's own error may reach (storage_reach)
STORAGE_SIGMAS = 6.0


def _half_spacing(x: torch.Tensor) -> torch.Tensor:
    """Half the spacing of ``x``'s 16-bit dtype at each stored value (float64, on the CPU; 0 at 0): the most
    that rounding a wider value to it moved it."""
    d = x.detach().to(torch.float64).cpu()
    _, e = torch.frexp(d)   # |d| in [2^(e-1), 2^e): spacing 2^(e-p)
    half = torch.ldexp(torch.ones_like(d), e - _SIGNIFICAND[x.dtype] - 1)
    return torch.where(d == 0, torch.zeros_like(d), half)


def storage_reach(outputs: dict, inputs, config, formed: Terms | None = None) -> dict[str, torch.Tensor]:
    """How far an implementation's correct ``dA_log``/``ddt_bias`` can land from the exact sum of the ``dg`` it
    returned where it returned ``dg`` (or the sum itself) in 16 bits: an implementation sums the ``dg`` it held
    before rounding it for return (fla's kernels do; autograd hands back a bf16 leaf's gradient in bf16 whatever
    the function computed). ``{name: absolute reach}`` in the sum's shape, for the quantities where it is
    nonzero: ``STORAGE_SIGMAS`` standard deviations of the sum of ``dg``'s rounding errors, each uniform within
    half a spacing (independent roundings), plus half a spacing of the sum's own 16-bit value. A wrong
    reduction beyond it is still called one; within it, the noise floor judges the cell (a correct fla_layer_varlen head 0 in fp32 mode: a float32 ``dA_log``
    3.2e-5 from the exact sum of its bf16 ``dg``, against 1e-5: a user trial). ``formed``: the
    :func:`terms` of ``outputs["dg"]``, already formed."""
    out = {}
    dg = outputs.get("dg")
    if dg is not None and dg.dtype in _SIGNIFICAND:
        d, c = formed or terms(dg, inputs, config)
        h2 = _half_spacing(dg).pow(2) / 3   # the variance of a rounding uniform within half a spacing
        out["dA_log"] = STORAGE_SIGMAS * (h2 * c.pow(2)).sum((0, 1, 3)).sqrt()
        out["ddt_bias"] = STORAGE_SIGMAS * h2.sum((0, 1)).sqrt().reshape(inputs.dt_bias.shape)
    for n in REDUCED:
        x = outputs.get(n)
        if x is not None and x.dtype in _SIGNIFICAND:
            own = _half_spacing(x).reshape(x.shape)
            out[n] = out[n].reshape(own.shape) + own if n in out else own
    return out


def sum_bars(absolute: torch.Tensor, count: int, stored: torch.Tensor | None, scale: torch.Tensor, tol
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """How far from the exact sum of an implementation's own ``dg`` its sum may be, as ratios of ``scale`` (that
    sum's RMS), from the RMS of ``rounding_reach``'s Σ|t| (``absolute``, over ``count`` terms) and of
    ``storage_reach`` (``stored``, None where nothing came back in 16 bits): ``(bar, reach)``, ``bar`` where a
    right sum lies (the tolerance, or float32's rounding of the sum where that is more), ``reach`` beyond which it
    is wrong (``bar`` plus the 16-bit storage's reach). One rule for ``diff``'s cells and ``run``'s heads."""
    slack = (2 + math.log2(max(count, 2))) * U32 * absolute
    bar = torch.clamp_min(slack / scale, tol)
    return bar, (bar if stored is None else torch.clamp_min((slack + stored) / scale, tol))


def head_split(name: str, value: torch.Tensor, ref: torch.Tensor, outputs: dict, inputs, config, tol: float,
               formed: Terms | None = None) -> list[dict]:
    """``run``'s per-head form of ``carried_from_dg``'s split, for the tensor ``value`` of reduced quantity ``name``
    against the reference ``ref``: per value head, ``{"head", "ratio" (the value against the reference),
    "carried" (the exact sum of the returned dg against the reference), "own" (the value against that sum),
    "bar" (how far from that sum a right sum may be: the tolerance, or float32's rounding of the sum where that
    is more), "reach" (beyond it the sum is wrong: ``bar`` plus, where ``dg`` or the sum came back in 16 bits,
    how far rounding the wider dg the implementation summed can move it, ``storage_reach``), "stored" (whether
    it did)}``, as ratios over the head's elements (one for ``dA_log``, K for ``ddt_bias``), as ``diff``'s
    per-head cells split it. Heads pooled, one head's reach hid another's wrong sum (a user trial: a
    dA_log 5 % off read "cannot be told apart" over the tensor, its head 0 beyond that head's reach), and one
    head's rounding allowance another's (adversarial trial: run failed a float32 sum diff carried in). ``formed``:
    the :func:`terms` of ``outputs["dg"]``, already formed."""
    formed = terms(outputs["dg"], inputs, config) if formed is None else formed
    stored = storage_reach(outputs, inputs, config, formed).get(name)
    HV = outputs["dg"].shape[2]
    exact = reductions_of(outputs["dg"], inputs, config, formed)[name].reshape(HV, -1)
    total, count = rounding_reach(outputs["dg"], inputs, config, formed)[name]
    rms = (lambda x: x.to(torch.float64).reshape(HV, -1).pow(2).sum(-1).sqrt())
    x, r = value.detach().cpu().to(torch.float64).reshape(HV, -1), ref.detach().cpu().to(torch.float64).reshape(HV, -1)
    scale = rms(exact).clamp_min(1e-300)
    bar, reach = sum_bars(rms(total), count, None if stored is None else rms(stored), scale, tol)
    carried, own = rms(exact - r) / rms(r).clamp_min(1e-300), rms(x - exact) / scale
    ratio = rms(x - r) / rms(r).clamp_min(1e-300)
    return [{"head": h, "ratio": float(ratio[h]), "carried": float(carried[h]), "own": float(own[h]),
             "bar": float(bar[h]), "reach": float(reach[h]), "stored": stored is not None} for h in range(HV)]


def head_fields(heads) -> list[dict]:
    """The per-head splits (``head_split``'s, ``unchecked_in``'s cells) as the JSON and the lines give them:
    ``{"head", "carried", "own", "reach"}`` each."""
    return [{k: d[k] for k in ("head", "carried", "own", "reach")} for d in heads]


def low_dtype(outputs: dict) -> str:
    """The 16-bit dtype ``dg`` (else the sums) came back in, by name, for the words of an uncheckable sum."""
    for n in ("dg", *REDUCED):
        x = outputs.get(n)
        if x is not None and x.dtype in _SIGNIFICAND:
            return str(x.dtype).removeprefix("torch.")
    return "16 bits"


def heads_text(heads: list[dict], say, most: int = 4) -> str:
    """``heads`` (per-head dicts) in words, ``say(head)`` each, the first ``most`` of them and how many more."""
    more = f"; and {len(heads) - most} more heads" if len(heads) > most else ""
    return "; ".join(say(d) for d in heads[:most]) + more


def unchecked_hint(carried: float, own: float) -> str:
    """Which part of an uncheckable sum's error (``unchecked_in``, ``head_split``) is the larger, in words."""
    if carried >= own:
        return "dg's part is the larger: dg's own error (its rows judge it), magnified where the head's terms cancel"
    return "the sum's own part is the larger: a wrong reduction, or dg's rounding within that reach"


class Split(NamedTuple):
    """One reduced quantity's error split per cell [R, Hs] (:func:`carried_from_dg`)."""
    carried: torch.Tensor     # the exact sum of the implementation's own dg against the reference
    sum_ok: torch.Tensor      # the implementation's value within the sum's bar of that exact sum
    sum_wrong: torch.Tensor   # (finitely) beyond it
    own: torch.Tensor         # the implementation's value against that exact sum (the sum's own error)
    exact: torch.Tensor       # the exact sum's rows, cut as the diff's rows
    coherent: torch.Tensor | None = None   # [R, Hs] how coherently dg's error sums in (COHERENT), with ref_dg
    unseen: torch.Tensor | None = None     # [R, Hs] cells with nothing compared (NaN/Inf on both sides)
    # [R, Hs] how far from that exact sum the value may be before the sum is wrong (sum_wrong; sum_bars' reach):
    # where dg (or the sum) came back in 16 bits (``stored``), how far rounding the wider dg it held can move it
    beyond: torch.Tensor | None = None
    stored: bool = False

    def sum_right(self, cells: Cells | None = None) -> bool:
        """Whether the sum is right at every cell compared, and some cell was: the whole tensor is then carried
        in from ``dg`` (a cell compared nowhere, as a NaN input's reach leaves it, neither passes nor blocks,
        as in ``run``'s whole-tensor rule, ``run.carry_from_dg``). With ``cells`` (the quantity's, labelled),
        every cell over its tolerance (not OK) instead: a head within it is not what put the tensor over
        (an adversarial trial: head 0 the exact sum of its own dg, head 1 within its bar with its sum
        0.0105 off, failed with no reason in run and diff)."""
        unseen = torch.zeros_like(self.sum_ok) if self.unseen is None else self.unseen.to(self.sum_ok.device)
        if cells is None or cells.label is None:
            return bool((self.sum_ok | unseen).all()) and bool(self.sum_ok.any())
        over = (cells.label.to(self.sum_ok.device) != noise.OK) & ~unseen
        return bool((self.sum_ok | ~over).all()) and bool((self.sum_ok & over).any())


def carried_from_dg(mine: dict, theirs: dict, row_ids: dict, outputs: dict, inputs, config, ct, chunk_list,
                    head_list, info, tols, group: int = 1, ref_dg: torch.Tensor | None = None) -> dict[str, Split]:
    """Per ``dA_log``/``ddt_bias`` row of the diff (``mine``/``theirs``: the implementation's and the
    reference's rows, as ``output_rows`` cuts them): a :class:`Split`. Empty where there is nothing to split
    (no gate, no ``dg``). ``ref_dg`` (the reference's ``dg``): a cell whose ``dg`` error sums
    coherently (``COHERENT``) is not ``sum_ok``: not carried in, judged as it is."""
    names = [n for n in REDUCED if n in mine and n in outputs]
    if config.gate == "none" or "dg" not in outputs or not names or inputs.dt_bias is None:
        return {}
    formed = terms(outputs["dg"], inputs, config)   # once: the sums, both reaches and the coherence use them
    sums = reductions_of(outputs["dg"], inputs, config, formed)
    exact, _ = output_rows({n: sums[n].to(outputs[n].device) for n in names}, ct, config.state_layout, chunk_list,
                           head_list, group)
    reach = rounding_reach(outputs["dg"], inputs, config, formed)
    absolute, _ = output_rows({n: reach[n][0].to(outputs[n].device) for n in names}, ct, config.state_layout,
                              chunk_list, head_list, group)
    stored = storage_reach(outputs, inputs, config, formed)
    stored, _ = output_rows({n: stored[n].to(outputs[n].device) for n in names if n in stored}, ct,
                            config.state_layout, chunk_list, head_list, group)
    rows = {n: row_ids[n] for n in names}
    got = compare_cells(exact, {n: theirs[n] for n in names}, rows, head_list, info, tols)   # carried in
    own = compare_cells({n: mine[n] for n in names}, exact, rows, head_list, info, tols)      # the sum's own
    coh = None
    if ref_dg is not None:
        per = coherence(outputs["dg"], ref_dg, inputs, config, formed)
        coh, _ = output_rows({n: per[n].to(outputs[n].device) for n in names}, ct, config.state_layout, chunk_list,
                             head_list, group)
    out = {}
    for n in names:
        # the sum's own error is wrong beyond its tolerance and beyond what float32 rounding of it can reach
        R, Hs = own[n].ratio.shape
        dev = own[n].ratio.device   # the cells' metrics; the rows may sit on the GPU (a CUDA run)
        rms = (lambda x: x.reshape(R, Hs, -1).pow(2).sum(-1).sqrt().to(dev))
        # float32 rounding of the sum itself; for a wrong sum (a BUG whatever its floor), the 16-bit storage of dg
        # or of the sum too (storage_reach). That storage's reach proves nothing right: no cell within it but over
        # the first bar is excused as carried in, the floor's rule judges it (UNREP, DRIFT or BUG)
        bar, bar_wrong = sum_bars(rms(absolute[n]), reach[n][1], rms(stored[n]) if n in stored else None,
                                  rms(exact[n]).clamp_min(1e-300), tols[n])
        ok = torch.isfinite(got[n].ratio) & (own[n].ratio <= bar)
        c = None
        if coh is not None:   # dg's error summing coherently: a bias in dg, not its rounding carried in
            c = torch.nan_to_num(coh[n].reshape(R, Hs, -1).to(dev), nan=0.0).amax(-1)
            ok = ok & ~(c > COHERENT)
        out[n] = Split(got[n].ratio, ok, torch.isfinite(own[n].ratio) & (own[n].ratio > bar_wrong), own[n].ratio, exact[n],
                       c, ((got[n].count == 0) & (got[n].nonfinite == 0)).to(dev), bar_wrong, n in stored)
    return out


def unchecked_in(cells: dict[str, Cells], carried: dict[str, Split]) -> dict[str, dict]:
    """Mark the ``dA_log``/``ddt_bias`` cells over their tolerance whose sum can be shown neither right nor wrong
    (``Cells.sum_check``): ``dg`` came back in 16 bits, and the implementation's value is beyond the sum's bar from
    the exact sum of that ``dg`` but within how far rounding the ``dg`` it summed can move it (``Split.beyond``). What
    is marked is where their error comes from: the exact sum of the returned ``dg`` against the reference is ``dg``'s part (a user
    trial: a ``dg`` error in a bf16 capture read as a ``dA_log`` BUG of its own, nothing saying the sum
    could not be checked). The cell keeps the noise floor's label: its value against the reference is what the
    floor judges, which the returned dg's rounding does not touch (a correct float32 sum 0.1 % off is a BUG by
    it); what the reach takes away is the split. A cell whose ``dg`` error sums coherently is left out (its own
    note: not carried in).
    Returns ``{name: the worst marked cell's {"row", "head", "carried", "own", "reach"}, with "cells" (how many) and
    "heads" (each marked cell's)}``, empty if none."""
    out = {}
    for n, split in carried.items():
        c = cells.get(n)
        if c is None or not split.stored or c.label is None:
            continue
        own, dev = split.own, split.own.device
        over = (c.label.to(dev) != noise.OK) & (c.count.to(dev) > 0)
        hit = over & ~split.sum_ok & ~split.sum_wrong & torch.isfinite(own) & (own <= split.beyond)
        if split.coherent is not None:
            hit = hit & ~(split.coherent > COHERENT)
        if not bool(hit.any()):
            continue
        nan = torch.full_like(own, float("nan"))
        c.sum_check = torch.stack([torch.where(hit, split.carried.to(dev), nan), torch.where(hit, own, nan),
                                   torch.where(hit, split.beyond, nan)], -1)
        cells_hit = [{"row": r, "head": c.heads[h], **dict(zip(("carried", "own", "reach"),
                                                                map(float, c.sum_check[r, h].tolist())))}
                     for r, h in hit.nonzero().tolist()]
        worst = max(cells_hit, key=lambda d: float(c.ratio[d["row"], c.heads.index(d["head"])]))
        out[n] = {**worst, "cells": len(cells_hit), "heads": cells_hit}
    return out


def wrong_sums(cells: dict[str, Cells], carried: dict[str, Split]) -> dict[str, list[dict]]:
    """The ``dA_log``/``ddt_bias`` cells that are BUG for a wrong sum (``Split.sum_wrong``, as ``carried_in``
    labels them): ``{name: [{"row", "head", "own", "beyond", "reach"}, ...]}``, ``reach`` None where nothing came
    back in 16 bits; empty if none. Each has a note: a BUG cell of theirs gave no reason (a user trial)."""
    out = {}
    for n, split in carried.items():
        c = cells.get(n)
        if c is None or c.label is None or split.beyond is None:
            continue
        hit = split.sum_wrong & (c.label.to(split.own.device) == noise.BUG)
        if bool(hit.any()):
            out[n] = [{"row": r, "head": c.heads[h], "own": float(split.own[r, h]), "beyond": float(split.beyond[r, h]),
                       "reach": float(split.beyond[r, h]) if split.stored else None}
                      for r, h in hit.nonzero().tolist()]
    return out


def carried_in(cells: dict[str, Cells], carried: dict[str, Split]) -> dict[str, float]:
    """Relabel BUG cells of ``dA_log``/``ddt_bias`` DRIFT where their sum is right (``carried_from_dg``),
    and label BUG a cell over its tolerance whose sum is wrong: the sum's own error is the implementation's
    reduction against the exact float64 sum of its own ``dg``, which no precision of ``dg`` excuses (a correct
    one is within 3e-6 of it in bf16 mode), only float32 rounding of the sum itself (``rounding_reach``), so
    neither its floor (UNREP) nor ten times it (DRIFT) lets it through
    (a dA_log 5 % off its own dg's sum read UNREP in bf16 mode: a user trial); nor where ``dg``'s error
    sums in coherently (``Split.coherent`` over ``COHERENT``: a bias, UNREP in bf16 mode once). Returns
    ``{name: the worst relabelled-DRIFT cell's carried ratio}``, empty if none."""
    out = {}
    for n, split in carried.items():
        ratio, sum_ok, sum_wrong = split.carried, split.sum_ok, split.sum_wrong
        c = cells[n]
        wrong = sum_wrong & (c.failing | (c.label == noise.UNREP))
        if split.coherent is not None:   # a bias in dg summed in: no rounding the floor models (UNREP) made it
            wrong = wrong | ((split.coherent > COHERENT) & (c.failing | (c.label == noise.UNREP)))
        if bool(wrong.any()):
            c.label = torch.where(wrong, torch.tensor(noise.BUG, dtype=c.label.dtype), c.label)
        # a DRIFT whose sum is right is carried in too: marked so, --strict does not fail it for dg's error, which
        # dg's own rows are judged by (a correct fp32 dA_log at 1.5e-5 against 1e-5 failed diff --strict while run
        # passed: a user trial)
        hit = ((c.label == noise.BUG) | (c.label == noise.DRIFT)) & sum_ok
        if bool(hit.any()):
            c.label = torch.where(hit, torch.tensor(noise.DRIFT, dtype=c.label.dtype), c.label)
            nan = torch.tensor(float("nan"), dtype=ratio.dtype)
            c.carried, c.carried_own = torch.where(hit, ratio, nan), torch.where(hit, split.own, nan)
            out[n] = float(ratio[hit].max())
    return out
