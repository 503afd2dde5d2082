"""Cells: one quantity (a tap or an output row, :mod:`.quantities`) over chunk rows × heads, with its
metrics (:func:`.metrics.cell_metrics`) and its label (OK / DRIFT / BUG / UNREP, :mod:`kdadbg.noise`).

:func:`output_rows` cuts whole outputs and gradients into per-chunk rows, so that whole tensors,
output rows and taps all go through :func:`compare_cells`, the one comparison path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import noise
from ..chunks import ChunkTable
from ..config import qk_heads
from .metrics import cell_metrics, exp_gc_weight, passes
from .quantities import ORDER, QK_ROWS, QUANTITIES, ChunkInfo, meaningful_mask, valid_mask


@dataclass
class Cells:
    """Metrics of one quantity over ``chunks`` (rows) × ``heads`` (columns); every tensor is ``[R, Hs]``.

    ``chunks`` are global chunk ids (a sequence's last chunk for ``ht``, its first for ``dh0``), or
    ``[None]`` for per-head quantities. ``heads`` are value heads, except when ``group > 1`` (``dq``,
    ``dk`` under GVA): then they are q/k heads, head ``h`` shared by value heads ``h*group ..
    (h+1)*group - 1``.
    """

    name: str
    chunks: list
    heads: list[int]
    dims: tuple[int, ...]
    tol: float
    ratio: torch.Tensor
    max_abs: torch.Tensor
    index: torch.Tensor          # flat index of the worst element within the cell
    cosine: torch.Tensor
    nonfinite: torch.Tensor
    count: torch.Tensor          # elements compared
    kernel: torch.Tensor         # value at the worst element
    reference: torch.Tensor
    floor: torch.Tensor | None = None
    label: torch.Tensor | None = None
    # [R] reason per chunk row where a cell is UNREP: one for the row, or a list with one per head
    unrep_reason: list | None = None
    # [R, Hs] dA_log/ddt_bias: the exact sum of the implementation's own dg against the reference, and the
    # implementation's value against that sum, where a BUG became DRIFT carried in from dg (compare.carried);
    # NaN elsewhere
    carried: torch.Tensor | None = None
    carried_own: torch.Tensor | None = None
    # [R, Hs, 3] dA_log/ddt_bias over tolerance whose sum can be shown neither right nor wrong (dg returned in 16
    # bits: compare.carried.unchecked_in): the exact sum of the returned dg against the reference, the
    # implementation's value against that sum, and how far rounding dg can move it; NaN elsewhere
    sum_check: torch.Tensor | None = None
    # diff A B with A not the float64 reference: why this quantity's DRIFT cells are DRIFT (within_tolerance_sum)
    drift_reason: str | None = None
    group: int = 1                     # > 1: heads are q/k heads of this many value heads each
    scale: float = 1.0                 # RMS of the reference over every compared element (metrics.scale_of)
    abs_floor: float | torch.Tensor = 1e-6   # the absolute rule's floor, 1e-6 scale (metrics.floors); per
    # cell ([R, Hs], 1e-6 times each cell's own scale) for the exp(-gc) taps (metrics.cell_metrics)
    weighted: bool = False             # the exp(-gc) taps: judged as exp(gc) x the tap (metrics.exp_gc_weight)

    @property
    def per_cell(self) -> bool:
        """Whether each cell was judged at its own scale (the exp(-gc) taps): ``abs_floor`` is then ``[R, Hs]``."""
        return isinstance(self.abs_floor, torch.Tensor)

    def column(self, value_head: int) -> int | None:
        """The column of value head ``value_head`` (its q/k head's for ``group > 1``), or None."""
        h = value_head // self.group
        return self.heads.index(h) if h in self.heads else None

    @property
    def quantity(self):
        return QUANTITIES[self.name]

    @property
    def stage(self) -> str:
        return self.quantity.stage

    @property
    def failing(self) -> torch.Tensor:
        """Over tolerance (DRIFT or BUG); UNREP cells never fail."""
        return (self.label == noise.DRIFT) | (self.label == noise.BUG)


def judge(cells: Cells, floor: dict | None = None, unrep: torch.Tensor | None = None,
          storage_tol: float | None = None) -> Cells:
    """Label every cell OK / DRIFT / BUG against the noise floor's metrics of the same cells (``floor``),
    and UNREP where ``unrep`` ([R, Hs] bool) says the compared precision cannot hold the value.
    ``storage_tol``: the quantity was returned in 16 bits and is judged at fp32's tolerance; as ``run`` does
    (``run.judged``), a cell its floor puts out of reach is UNREP only within this tolerance (bf16 mode's):
    over it, it stays DRIFT or BUG."""
    passed = passes(cells.ratio, cells.max_abs, cells.nonfinite, cells.tol, cells.abs_floor)
    if floor is not None:
        cells.floor = floor["ratio"]
        label = noise.classify(passed, cells.ratio, cells.nonfinite, floor["ratio"], floor["nonfinite"])
    else:
        label = noise.classify(passed, cells.ratio, cells.nonfinite)
    if floor is not None:
        # the same algorithm at the compared precision (the floor) cannot hold the cell to its tolerance.
        # For a tap carrying exp(-gc) its rounding is amplified by the gate's spread (exp(-gc) at e^30..e^88
        # multiplies quantities of e^-30..e^-88): any label gives way. Elsewhere (a gradient row whose
        # chunk cancels) a DRIFT does; a BUG, over ten times that floor, stays one. Measured cell by cell.
        exp_tap = cells.name in noise.EXP_NEG_GC_TAPS
        limited = (floor["ratio"] > cells.tol) | (~torch.isfinite(floor["ratio"]) if exp_tap else False)
        limited = limited & ((label != noise.OK) if exp_tap else (label == noise.DRIFT))
        if storage_tol is not None:
            limited = limited & passes(cells.ratio, cells.max_abs, cells.nonfinite, storage_tol, cells.abs_floor)
        if bool(limited.any()):
            reasons = list(cells.unrep_reason) if cells.unrep_reason else [None] * label.shape[0]
            for r in range(label.shape[0]):
                hit = limited[r]
                if reasons[r] is None and bool(hit.any()):   # each head's own floor
                    reasons[r] = [None if not bool(hit[h]) else
                                  f"the compared precision cannot hold it to its tolerance: the noise floor (the "
                                  f"reference at that precision) is {float(floor['ratio'][r, h]):.3g} > tol "
                                  f"{cells.tol:g}" + ("" if storage_tol is None else
                                                      f"; returned in 16 bits, within bf16 mode's tol {storage_tol:g}")
                                  for h in range(hit.numel())]
            cells.unrep_reason = reasons
            unrep = limited if unrep is None else (unrep | limited)
    if unrep is not None:
        label = torch.where(unrep & (label != noise.OK), torch.tensor(noise.UNREP, dtype=torch.int8), label)
    cells.label = label
    return cells


def within_tolerance_sum(cells: Cells, bound: float, reason: str) -> int:
    """``diff A B`` where A is not the float64 reference: both files are approximations, so a correct pair may
    differ by up to the sum of their tolerances (``bound``). A BUG cell (no floor: every cell over its tolerance)
    with a finite ratio within ``bound`` becomes DRIFT, ``reason`` saying why; beyond it, it stays a BUG. Returns
    how many cells it relabelled."""
    hit = (cells.label == noise.BUG) & (cells.count > 0) & (cells.nonfinite == 0) & (cells.ratio <= bound)
    if bool(hit.any()):
        cells.label = torch.where(hit, torch.tensor(noise.DRIFT, dtype=torch.int8), cells.label)
        cells.drift_reason = reason
    return int(hit.sum())


def hollow_triangles(met: dict, x: torch.Tensor, ref: torch.Tensor, meaningful: torch.Tensor | None) -> None:
    """A triangular tap's cell whose every meaningful element (``meaningful_mask``) is NaN/Inf on both sides
    compared only the structural zeros above its diagonal: its ``count`` becomes 0 (not compared, never OK)
    where those agreed exactly. Where they did not, the cell is judged on them (a kernel writing above the
    diagonal is wrong). A chunk whose valid rows leave no meaningful element (``L`` of a one-token chunk)
    keeps its count: there the structure is all there is."""
    if meaningful is None:
        return
    dev = ref.device
    R, Hs = x.shape[0], x.shape[1]
    m = meaningful.to(dev).expand(x.shape).reshape(R, Hs, -1)
    live = (m & (torch.isfinite(x.detach().to(dev)) | torch.isfinite(ref.detach())).reshape(R, Hs, -1)).sum(-1)
    hollow = (m.sum(-1) > 0) & (live == 0)
    hollow = hollow.cpu() & (met["nonfinite"] == 0) & (met["max_abs"] == 0)
    met["count"] = torch.where(hollow, torch.zeros_like(met["count"]), met["count"])


def robust_floor(ratio: torch.Tensor) -> torch.Tensor:
    """A cell's floor is one sample of the error its precision makes, and the samples scatter: `dqd` of a
    model-size `fla_layer_varlen` dump in bf16 mode had floors from 7.6e-4 to 1.6e-2 over 17 chunks x 8 heads
    (`docs/cpu/model_size_fla_layer_varlen.log`), and the 7.6e-4 cell made a BUG of a ratio its neighbours
    call drift. So each finite floor is raised to at least the median finite floor of its quantity over the
    compared cells; NaN/inf floors are kept (they mean the floor run itself overflowed there)."""
    fin = torch.isfinite(ratio)
    if not bool(fin.any()):
        return ratio
    med = ratio[fin].median()
    return torch.where(fin, torch.maximum(ratio, med), ratio)


def compare_cells(cand: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], chunks: dict[str, list],
                  heads: list[int], info: ChunkInfo, tols: dict[str, float],
                  floor: dict[str, torch.Tensor] | None = None, unrep: dict | None = None,
                  group: int = 1, storage_tols: dict[str, float] | None = None,
                  gc: torch.Tensor | None = None) -> dict[str, Cells]:
    """Cells of every quantity present in both sides, in dataflow order; each side
    ``[len(chunks[name]), len(heads), *shape]`` over the value heads ``heads``; a ``floor`` value may be a
    tuple of samples, each cell's floor then the largest (``dq``/``dk`` with GVA,
    ``group > 1``: over their q/k heads, as :func:`output_rows` cuts them). ``unrep``: name -> ([R, Hs]
    bool, [R] reasons). ``storage_tols``: name -> bf16 mode's tolerance, for the quantities returned in 16 bits
    and judged at fp32's (:func:`judge`). ``gc``: the float64 reference's ``gc`` for the taps' cells
    (``[R, Hs, C, K]``, the rows and heads of ``cand``'s taps), by which the exp(-gc) taps are weighted
    (:func:`metrics.exp_gc_weight`); without it they are compared unweighted."""
    out = {}
    gc_weight = None if gc is None else exp_gc_weight(gc)   # one weight for every exp(-gc) tap
    for name in ORDER:
        if name not in cand or name not in ref:
            continue
        qk = group > 1 and name in QK_ROWS
        hs = qk_heads(heads, group) if qk else list(heads)
        ids = chunks[name]
        lengths = torch.tensor([info.length[c] if c is not None else 0 for c in ids], dtype=torch.long)
        dims = tuple(cand[name].shape[2:])
        mask = valid_mask(name, lengths, dims)
        own = name in noise.EXP_NEG_GC_TAPS   # each cell judged at its own scale (metrics.cell_metrics)
        weight = gc_weight if own else None
        if weight is not None and tuple(weight.shape) != tuple(cand[name].shape):
            raise ValueError(f"gc {tuple(gc.shape)} does not match {name}'s cells {tuple(cand[name].shape)}")
        met = cell_metrics(cand[name], ref[name], mask, per_cell=own, weight=weight)
        hollow_triangles(met, cand[name], ref[name], meaningful_mask(name, lengths, dims))
        cells = Cells(name, list(ids), hs, dims, tols[name], **met, group=group if qk else 1,
                      weighted=weight is not None)
        fl = None
        if floor is not None and name in floor:
            # one floor run, or several samples (noise.perturbed): each cell takes the largest
            samples = floor[name] if isinstance(floor[name], (tuple, list)) else (floor[name],)
            fms = [cell_metrics(f, ref[name], mask, per_cell=own, weight=weight) for f in samples]
            ratio = torch.stack([m["ratio"] for m in fms]).amax(0)
            nonf = torch.stack([m["nonfinite"] for m in fms]).amax(0)
            # an output that overflows where the float64 reference is finite is a bug, whatever the floor
            fl = {"ratio": robust_floor(ratio), "nonfinite": nonf if cells.quantity.is_tap else None}
        u = None
        if unrep is not None and name in unrep:
            u, cells.unrep_reason = unrep[name]
        out[name] = judge(cells, fl, u, (storage_tols or {}).get(name))
    return out


# outputs and gradients as per-chunk rows


def _state_kv(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.transpose(-1, -2) if layout == "vk" else t


def output_rows(outputs: dict[str, torch.Tensor], ct: ChunkTable, layout: str, chunks: list[int],
                heads: list[int], group: int = 1) -> tuple[dict[str, torch.Tensor], dict[str, list]]:
    """Outputs and gradients in dump shapes -> per-cell tensors ``[R, Hs, *shape]`` (float64, padding
    rows 0) and the chunk id of each row: token rows for the chunks in ``chunks``; ``ht`` at each
    sequence's last chunk and ``dh0`` at its first (states in math layout ``[K,V]``), for sequences whose
    chunk lies in ``chunks``; ``dA_log``/``ddt_bias`` one row per head (chunk ``None``). ``heads`` are
    value heads; with GVA (``group`` value heads per q/k head) ``dq``/``dk`` take the q/k heads they read."""
    idx, valid = ct.token_index()
    sel = torch.tensor(chunks, dtype=torch.long)
    idx, valid = idx[sel], valid[sel]
    hsel = torch.tensor(heads, dtype=torch.long)
    qsel = torch.tensor(qk_heads(heads, group), dtype=torch.long)
    rows, ids = {}, {}
    want = set(chunks)
    for name, t in outputs.items():
        q = QUANTITIES.get(name)
        if q is None:
            continue
        t = t.detach()
        hs = (qsel if group > 1 and name in QK_ROWS else hsel).to(t.device)
        if q.kind == "row":
            flat = t.reshape(-1, *t.shape[2:]).index_select(1, hs)           # [B*T, Hs, *]
            x = flat[idx.reshape(-1).to(t.device)].reshape(len(chunks), ct.chunk_size, *flat.shape[1:])
            x = x * valid.to(t.device).reshape(len(chunks), ct.chunk_size, *([1] * (flat.ndim - 1)))
            rows[name] = x.movedim(1, 2).to(torch.float64)                   # [R, Hs, C, *]
            ids[name] = list(chunks)
        elif q.kind == "seq":
            base = ct.seq_chunk_base
            at = [(n, int(base[n + 1]) - 1 if name == "ht" else int(base[n])) for n in range(ct.n_seqs)
                  if int(base[n + 1]) > int(base[n])]
            at = [(n, c) for n, c in at if c in want]
            if not at:
                continue
            ns = torch.tensor([n for n, _ in at], dtype=torch.long, device=t.device)
            rows[name] = _state_kv(t, layout).index_select(0, ns).index_select(1, hs).to(torch.float64)
            ids[name] = [c for _, c in at]
        else:  # per head
            x = t.reshape(t.shape[0], -1) if t.ndim > 1 else t.reshape(-1, 1)
            x = x.index_select(0, hs).to(torch.float64)
            rows[name] = (x[None] if name == "ddt_bias" else x[None, :, 0])    # [1, Hs, K] / [1, Hs]
            ids[name] = [None]
    return rows, ids


def unrepresentable(ref_taps: dict[str, torch.Tensor], names, rows_of: dict[str, list], heads: list[int],
                    info: ChunkInfo, first_chunk: int = 0) -> dict[str, tuple[torch.Tensor, list]]:
    """Cells whose values float32 cannot hold: taps that carry ``exp(-gc)`` (``ki``, ``dqd``, ``dkd``) in a
    chunk where ``-gc`` exceeds ln(max float32) ≈ 88.7 for that head. ``ref_taps['gc']``:
    ``[n_chunks, H, C, K]`` (every head; row 0 is chunk ``first_chunk``). Returns name -> (``[R, Hs]``
    bool, ``[R]`` reason)."""
    if "gc" not in ref_taps:
        return {}
    gc = ref_taps["gc"]
    lim = noise.EXP_LIMIT_FP32
    out = {}
    for name in names:
        if name not in noise.EXP_NEG_GC_TAPS or name not in rows_of:
            continue
        ids = rows_of[name]
        sel = torch.tensor([c - first_chunk for c in ids], dtype=torch.long, device=gc.device)
        g = gc.index_select(0, sel).index_select(1, torch.tensor(heads, dtype=torch.long, device=gc.device))
        lengths = torch.tensor([info.length[c] for c in ids], device=gc.device)
        valid = (torch.arange(g.shape[2], device=gc.device)[None, :] < lengths[:, None])[:, None, :, None]
        worst = torch.where(valid, -g.to(torch.float64), torch.tensor(-math.inf, dtype=torch.float64,
                                                                        device=gc.device)).amax(dim=(2, 3))
        hit = (worst > lim).cpu()
        reasons = [f"exp(-gc) reaches e^{float(w.max()):.4g} > float32's max e^{lim:.4g}" if bool(h.any())
                   else None for w, h in zip(worst.cpu(), hit)]
        out[name] = (hit, reasons)
    return out
