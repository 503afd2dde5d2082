"""``DiffResult``: the cells of one comparison and the questions asked of them (first divergence, first
BUG, first NaN/Inf, per head, grid, minimum tolerances), plus the JSON document (schema ``DIFF_JSON``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .. import noise
from ..config import KDAConfig
from .cells import Cells
from ..schema import DIFF_JSON
from .metrics import not_compared_reason
from .quantities import ORDER, QUANTITIES, ChunkInfo, dataflow_key

MAX_JSON_CELLS = 200_000          # beyond this, --json lists only the cells over tolerance
NOT_COMPARED = "NOT_COMPARED"     # the label of a cell with no element compared (count 0): never OK, never a pass


def label_of(cells: Cells, r: int, j: int) -> str:
    """The label a user sees for cell (``r``, ``j``): ``NOT_COMPARED`` where no element was compared
    (every one NaN/Inf on both sides), else OK / DRIFT / BUG / UNREP."""
    return NOT_COMPARED if int(cells.count[r, j]) == 0 else noise.LABELS[int(cells.label[r, j])]


def unrep_reason(cells: Cells, r: int, j: int) -> str | None:
    """Why UNREP cell (``r``, ``j``) is UNREP: its row's reason, or its own head's (its own floor)."""
    reason = cells.unrep_reason[r]
    return reason[j] if isinstance(reason, list) else reason


def _sum_split(cells: Cells, r: int, j: int) -> dict:
    """A ``dA_log``/``ddt_bias`` cell's split of its error, for the JSON: ``carried_in_from_dg`` where carried in
    from ``dg``, ``sum_not_checkable`` where its sum cannot be checked (``compare.carried``), else nothing."""
    out = {}
    if cells.carried is not None and math.isfinite(float(cells.carried[r, j])):
        out["carried_in_from_dg"] = {"ratio": float(cells.carried[r, j]), "own": float(cells.carried_own[r, j])}
    if cells.sum_check is not None and math.isfinite(float(cells.sum_check[r, j, 2])):
        out["sum_not_checkable"] = dict(zip(("carried", "own", "reach"), map(float, cells.sum_check[r, j].tolist())))
    return out


def knob_overrides() -> dict[str, str]:
    """The kernels' launch knobs set in the environment (``kernels/tuning.py``), ``{NAME: value}``; empty
    for a copy of ``kernels/`` older than the knob table (A/B runs)."""
    from kdadbg_kernels import tuning

    return tuning.overrides() if hasattr(tuning, "overrides") else {}


@dataclass
class DiffResult:
    mode: str                      # impl | files
    sources: tuple[str, str]       # (candidate, reference) names
    precision: str
    device: str | None
    dump: str | None
    config: KDAConfig | None
    info: ChunkInfo
    chunks: list[int]
    heads: list[int]
    cells: dict[str, Cells]
    impl: dict = field(default_factory=dict)
    drift_fails: bool = False
    missing: dict = field(default_factory=dict)
    not_provided: dict = field(default_factory=dict)
    origin: dict | None = None
    # the window rerun of the first divergence where it is not the focus (a DRIFT before the first BUG): a
    # DRIFT well over its floor can be the cause the BUG comes from
    origin_first: dict | None = None
    amplification: list[dict] = field(default_factory=list)
    exponents: list[dict] = field(default_factory=list)
    repeat: dict | None = None
    notes: list[str] = field(default_factory=list)
    files: dict = field(default_factory=dict)
    nonfinite_inputs: dict | None = None    # {"tensors": {...}, "agree": bool} with --allow-nonfinite
    knobs: dict = field(default_factory=lambda: knob_overrides())  # KDADBG_* knob overrides in effect
    # each output and gradient over the compared rows as one tensor, judged as `run` judges it
    # (diff.tensor_verdicts): {name: {ratio, max_abs, tol, storage, elements, pass, unrep, carried_in_from_dg,
    # failed}}
    tensors: dict = field(default_factory=dict)
    taps_asked: bool = False   # the taps were named (--taps): one not provided keeps the verdict from a pass

    # -- counting ---------------------------------------------------------------------------------

    def counts(self) -> dict:
        """Cells and elements compared, split into taps and output rows, and cells per label."""
        out = {"cells": 0, "tap_cells": 0, "row_cells": 0, "elements": 0,
               **{lab.lower(): 0 for lab in noise.LABELS}, "not_compared": 0, "carried": 0}
        for c in self.cells.values():
            compared = c.count > 0
            if c.carried is not None:   # DRIFT cells of dA_log/ddt_bias carried in from dg (compare.carried)
                out["carried"] += int((torch.isfinite(c.carried) & compared).sum())
            n = int(compared.sum())
            out["not_compared"] += int((~compared).sum())
            out["cells"] += n
            out["tap_cells" if c.quantity.is_tap else "row_cells"] += n
            out["elements"] += int(c.count.sum())
            for i, lab in enumerate(noise.LABELS):
                out[lab.lower()] += int(((c.label == i) & compared).sum())
        return out

    # -- searching --------------------------------------------------------------------------------

    def order(self) -> list[tuple[str, int]]:
        """(name, row) pairs in dataflow order; ``row`` indexes ``self.cells[name].chunks``."""
        pairs = [(n, r) for n, c in self.cells.items() for r in range(len(c.chunks))]
        return sorted(pairs, key=lambda p: dataflow_key(p[0], self.cells[p[0]].chunks[p[1]], self.info))

    def _first_cell(self, pick, head: int | None = None) -> tuple[str, int] | None:
        """(name, row) of the first cell in dataflow order where ``pick(cells)`` ([R, Hs] bool) holds."""
        best = None
        for name, cells in self.cells.items():
            hit = pick(cells)
            if head is not None:   # a value head (dq, dk under GVA: its q/k head's column)
                j = cells.column(head)
                if j is None:
                    continue
                hit = hit[:, j][:, None]
            rows = hit.any(1).nonzero().flatten().tolist()
            if rows:
                key, r = min((dataflow_key(name, cells.chunks[r], self.info), r) for r in rows)
                if best is None or key < best[0]:
                    best = (key, name, r)
        return None if best is None else (best[1], best[2])

    def _first(self, pick) -> dict | None:
        found = self._first_cell(pick)
        if found is None:
            return None
        name, r = found
        cells = self.cells[name]
        score = torch.where(pick(cells)[r], cells.ratio[r].nan_to_num(posinf=1e300),
                            torch.tensor(-1.0, dtype=torch.float64))
        return self.locate(name, r, cells.heads[int(score.argmax())])

    def _fails(self, cells: Cells) -> torch.Tensor:
        if not self.drift_fails:
            return cells.label == noise.BUG
        # --strict: every DRIFT too, but for one carried in from dg (compare.carried: dg's rows judge that error)
        carried = torch.zeros_like(cells.failing) if cells.carried is None else \
            torch.isfinite(cells.carried).to(cells.failing.device)
        return cells.failing & ~carried

    @property
    def focus(self) -> dict | None:
        """The cell the window rerun and the amplification follow: the first BUG where there is one, else the
        first divergence (a DRIFT first divergence is within its noise; a bug after it is what to chase)."""
        return self.first_bug if self.first_bug is not None else self.first_divergence

    @property
    def first_divergence(self) -> dict | None:
        """The first cell over its tolerance in dataflow order (DRIFT or BUG; never UNREP), or None."""
        return self._first(lambda c: c.failing)

    @property
    def first_bug(self) -> dict | None:
        return self._first(lambda c: c.label == noise.BUG)

    @property
    def first_chunk_bug(self) -> dict | None:
        """The first BUG cell that has a chunk (not a per-head sum, dA_log/ddt_bias), or None."""
        return self._first(lambda c: (c.label == noise.BUG) & (c.quantity.kind != "head"))

    @property
    def first_nonfinite(self) -> dict | None:
        return self._first(lambda c: (c.nonfinite > 0) & (c.label != noise.UNREP))

    @property
    def verdict(self) -> str:
        """``fail`` (a failing cell, an output or gradient that fails as a whole tensor as ``run`` judges it:
        ``tensors_failing``, or NaN/Inf inputs where the sides disagree), ``not_compared`` (no
        cell compared any element: every one NaN/Inf on both sides; never a pass), ``partial`` (nothing
        failed, but an output or gradient, or a tap named with --taps, was not provided, e.g. by a
        forward-only implementation: exit 3,
        not a full pass, as in ``run``; what a ``--chunks`` window leaves out by itself does not count), else
        ``pass``."""
        if self.nonfinite_inputs is not None and not self.nonfinite_inputs["agree"]:
            return "fail"
        if any(bool(self._fails(c).any()) for c in self.cells.values()):
            return "fail"
        if self.tensors_failing:
            return "fail"
        if not any(bool((c.count > 0).any()) for c in self.cells.values()):
            return "not_compared"
        if self.missing_outputs or self.outputs_not_compared or self.taps_not_provided:
            return "partial"
        return "pass"

    @property
    def outputs_not_compared(self) -> list[str]:
        """Outputs and gradients returned of which no element was compared (NaN/Inf on both sides in every
        compared row): nothing judged them, so the verdict is at best partial, as ``run``'s is."""
        return [n for n, c in self.cells.items() if not c.quantity.is_tap and not bool((c.count > 0).any())]

    @property
    def tensors_failing(self) -> list[str]:
        """Outputs and gradients that fail as whole tensors (over the compared rows) by ``run``'s rule."""
        return [n for n, t in self.tensors.items() if t.get("failed")]

    def tensor_lead(self, name: str) -> dict | None:
        """Where to look in a tensor that fails whole: its first cell over its tolerance that is not UNREP
        (DRIFT, BUG, NaN/Inf) in dataflow order, at the head worst there; where every such cell is UNREP, the one
        furthest over its own noise floor (ratio / floor): the UNREP cells of a clean run sit near their floor, a
        bug's stand out. ``locate``'s dict with ``"lead"``: ``"first"`` or ``"over_floor"``; None where no cell
        is over its tolerance (the sum over, every cell within). A user trial: in bf16 mode a dg missing
        a term read UNREP in every chunk it touched, the verdict failed on the whole tensor and nothing said
        where; adversarial trial: the first UNREP cell was bf16 noise ahead of the planted fault."""
        cells = self.cells.get(name)
        if cells is None:
            return None
        over = (cells.count > 0) & ((cells.ratio.nan_to_num(nan=math.inf) > cells.tol) | (cells.nonfinite > 0))
        judged = over & ((cells.label != noise.UNREP) | (cells.nonfinite > 0))
        rows = judged.any(1).nonzero().flatten().tolist()
        if rows:
            _, r = min((dataflow_key(name, cells.chunks[r], self.info), r) for r in rows)
            score = torch.where(judged[r], cells.ratio[r].nan_to_num(nan=1e300, posinf=1e300),
                                torch.tensor(-1.0, dtype=torch.float64))
            return {**self.locate(name, r, cells.heads[int(score.argmax())]), "lead": "first"}
        if not bool(over.any()) or cells.floor is None:
            return None
        excess = torch.where(over, cells.ratio / cells.floor.clamp_min(1e-300), torch.tensor(-1.0, dtype=torch.float64))
        r, j = divmod(int(excess.argmax()), excess.shape[1])
        return {**self.locate(name, r, cells.heads[j]), "lead": "over_floor"}

    @property
    def taps_not_provided(self) -> list[str]:
        """Taps named with ``--taps`` that the implementation (or either file of ``diff A B``) does not provide:
        nothing compared them, so the verdict is at best partial. (Not asked by name, every tap is asked of an implementation
        that may write some or none: those it lacks are listed, not held against it.)"""
        if not self.taps_asked:
            return []
        return list(dict.fromkeys([*self.missing.get("taps", []), *self.missing.get("not_in_reference_file", [])]))

    @property
    def missing_outputs(self) -> dict[str, str]:
        """Outputs and gradients not provided, less what a ``--chunks`` window leaves out by itself."""
        from ..window import shortfalls

        return shortfalls(self.not_provided)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def locate(self, name: str, r: int, head: int) -> dict:
        """Everything about one cell (``r``: its row in ``cells[name].chunks``) and its worst element."""
        cells = self.cells[name]
        chunk = cells.chunks[r]
        h = cells.heads.index(head)
        q = QUANTITIES[name]
        index = [int(i) for i in torch.unravel_index(cells.index[r, h], cells.dims)] if cells.dims else []
        row = next((index[a] for a in q.row_dims), None)
        d = {"tap": name, "kind": q.kind, "stage": q.stage, "chunk": chunk, "head": head,
             "seq": None if chunk is None else self.info.seq[chunk],
             "chunk_in_seq": None if chunk is None else self.info.t[chunk], "row": row,
             "token": None if row is None or chunk is None else self.info.start[chunk] + row,
             "index": index, "axes": list(q.shape),
             "ratio": float(cells.ratio[r, h]), "max_abs": float(cells.max_abs[r, h]),
             "cosine": float(cells.cosine[r, h]), "nonfinite": int(cells.nonfinite[r, h]),
             "count": int(cells.count[r, h]),
             "kernel": float(cells.kernel[r, h]), "reference": float(cells.reference[r, h]),
             "tol": cells.tol, "floor": None if cells.floor is None else float(cells.floor[r, h]),
             **({"abs_floor": float(cells.abs_floor[r, h])} if cells.per_cell else {}),
             **({"weighted_by": "exp(gc)"} if cells.weighted else {}),
             "label": label_of(cells, r, h)}
        if cells.group > 1:   # dq, dk under GVA: ``head`` is a q/k head
            d["value_heads"] = list(range(head * cells.group, (head + 1) * cells.group))
        if d["count"] == 0:   # nothing compared: no figure is a measurement
            d.update(ratio=None, max_abs=None, cosine=None, kernel=None, reference=None, index=None, row=None,
                     token=None, reason=not_compared_reason(math.prod(cells.dims), name))
            return d
        if d["count"] <= d["nonfinite"] or not math.isfinite(d["cosine"]):   # no element finite on both
            d["cosine"] = None                                                 # sides, or a side all 0: no cosine
        for axis, sym in enumerate(q.shape):
            if sym in ("K", "V"):
                d[sym.lower()] = index[axis]
        if d["label"] == "DRIFT" and cells.drift_reason:   # diff A B, A not the float64 reference
            d["reason"] = cells.drift_reason
        elif d["label"] == "UNREP" and cells.unrep_reason and unrep_reason(cells, r, h):
            d["reason"] = unrep_reason(cells, r, h)
        d.update(_sum_split(cells, r, h))
        return d

    def min_tolerance(self) -> dict[str, dict]:
        """Per quantity: the smallest tolerance every judged cell would pass (its worst ratio) and where.
        Judged: compared (count > 0), not UNREP and not passed by the absolute rule alone (over its tolerance,
        its max abs error within the floor: it passes at any tolerance); UNREP cells are over their tolerance by definition and
        counted apart (``unrep``), as are cells with nothing compared (``not_compared``). ``min_tol`` (and
        its chunk and head) is None where no cell was judged."""
        out = {}
        for name, cells in self.cells.items():
            # (a cell within the absolute rule's floor passes at any tolerance: no tolerance is needed for it)
            absolute = (cells.label == noise.OK) & (cells.nonfinite == 0) & (cells.max_abs <= cells.abs_floor) & \
                ~(cells.ratio <= cells.tol)
            judged = (cells.label != noise.UNREP) & (cells.count > 0) & ~absolute
            r = torch.where(judged, cells.ratio, torch.tensor(-1.0, dtype=torch.float64))
            flat = int(torch.nan_to_num(r, nan=math.inf).argmax())
            i, j = divmod(flat, r.shape[1])
            any_judged = bool(judged.any())
            out[name] = {"tol": cells.tol, "min_tol": float(r.max()) if any_judged else None,
                         "chunk": cells.chunks[i] if any_judged else None,
                         "head": cells.heads[j] if any_judged else None,
                         "drift": int((cells.label == noise.DRIFT).sum()),
                         "bug": int((cells.label == noise.BUG).sum()),
                         "unrep": int((cells.label == noise.UNREP).sum()),
                         "not_compared": int((cells.count == 0).sum())}
        return out

    # -- views ------------------------------------------------------------------------------------

    def grid(self, max_columns: int = 24) -> dict:
        """The quantity × chunk grid (per-head quantities apart), chunks bucketed into at most
        ``max_columns`` columns; each cell is the worst (label, then ratio) over the bucket's chunks and
        every head (``NOT_COMPARED``, ratio None, where no head compared an element), or None where the
        quantity has no cell there."""
        n = len(self.chunks)
        per = max(1, math.ceil(n / max(1, max_columns)))
        buckets = [self.chunks[i:i + per] for i in range(0, n, per)]
        rows = []
        for name in (t for t in ORDER if t in self.cells and QUANTITIES[t].kind != "head"):
            cells = self.cells[name]
            pos = {c: r for r, c in enumerate(cells.chunks)}
            out = []
            for b in buckets:
                rs = [pos[c] for c in b if c in pos]
                if not rs:
                    out.append(None)
                    continue
                lab = cells.label[rs].to(torch.float64)
                rank = torch.where(lab == noise.UNREP, torch.tensor(0.5, dtype=torch.float64), lab)
                rank = torch.where(cells.count[rs] > 0, rank, torch.tensor(-1.0, dtype=torch.float64))
                score = rank * 1e300 + torch.nan_to_num(cells.ratio[rs], posinf=1e299)
                flat = int(score.argmax())
                i, j = divmod(flat, len(cells.heads))
                r = rs[i]
                lab = label_of(cells, r, j)
                out.append({"label": lab, "ratio": None if lab == NOT_COMPARED else float(cells.ratio[r, j]),
                            "nonfinite": int(cells.nonfinite[rs].sum()), "chunk": cells.chunks[r],
                            "head": cells.heads[j]})
            rows.append({"tap": name, "stage": cells.stage, "kind": cells.quantity.kind, "tol": cells.tol,
                         "cells": out})
        cols = [(b[0], b[-1]) for b in buckets]
        return {"columns": cols, "rows": rows, "bucket": per}

    def per_head_quantities(self) -> list[dict]:
        """``dA_log``/``ddt_bias`` cells: one per head."""
        out = []
        for name in ("dA_log", "ddt_bias"):
            if name in self.cells:
                c = self.cells[name]
                for j, h in enumerate(c.heads):
                    out.append(self.locate(name, 0, h))
        return out

    def per_head(self) -> list[dict]:
        """Per (value) head: worst ratio per stage, failing cells, and the first failing (name, chunk);
        with GVA a value head counts the dq/dk cells of the q/k head it reads."""
        out = []
        for h in self.heads:
            worst, fails = {}, 0
            for name, cells in self.cells.items():
                jj = cells.column(h)
                if jj is None:
                    continue
                ok = (cells.label[:, jj] != noise.UNREP) & (cells.count[:, jj] > 0)
                if bool(ok.any()):
                    worst[cells.stage] = max(worst.get(cells.stage, 0.0), float(cells.ratio[ok, jj].max()))
                fails += int(self._fails(cells)[:, jj].sum())
            found = self._first_cell(lambda c: c.failing, head=h)
            first = None if found is None else {"tap": found[0], "chunk": self.cells[found[0]].chunks[found[1]]}
            out.append({"head": h, "worst": worst, "failing": fails, "first": first})
        return out

    def as_json(self) -> dict:
        """The ``--json`` document (schema ``DIFF_JSON``; README, section "kdadbg diff")."""
        first, bug, focus = self.first_divergence, self.first_bug, self.focus
        key = (lambda c: None if c is None else (c["tap"], c["chunk"], c["head"]))
        # the rerun's verdict goes with the cell it was of (DiffResult.focus: the first BUG where there is one)
        if first is not None:
            rerun = self.origin if key(first) == key(focus) else self.origin_first
            first = {**first, "origin": (rerun or {}).get("verdict")}
        if bug is not None:
            bug = {**bug, "origin": (self.origin or {}).get("verdict") if key(bug) == key(focus) else None}
        n_cells = sum(c.ratio.numel() for c in self.cells.values())
        truncated = n_cells > MAX_JSON_CELLS
        cells = []
        for name, r in self.order():
            c = self.cells[name]
            for j, h in enumerate(c.heads):
                lab = int(c.label[r, j])
                count = int(c.count[r, j])
                if truncated and lab == noise.OK and count:
                    continue
                chunk = c.chunks[r]
                idx = None if not count else \
                    [int(i) for i in torch.unravel_index(c.index[r, j], c.dims)] if c.dims else []
                nothing = count == 0   # nothing compared: no figure is a measurement
                cells.append({"tap": name, "kind": c.quantity.kind, "stage": c.stage, "chunk": chunk, "head": h,
                              "seq": None if chunk is None else self.info.seq[chunk],
                              "ratio": None if nothing else _num(c.ratio[r, j]),
                              "max_abs": None if nothing else _num(c.max_abs[r, j]), "index": idx,
                              "cosine": None if count <= int(c.nonfinite[r, j]) else _num(c.cosine[r, j]),
                              "nonfinite": int(c.nonfinite[r, j]), "count": count, "tol": c.tol,
                              "floor": None if c.floor is None or nothing else _num(c.floor[r, j]),
                              **({"abs_floor": None if nothing else _num(c.abs_floor[r, j])} if c.per_cell else {}),
                              **({"weighted_by": "exp(gc)"} if c.weighted else {}),
                              "label": label_of(c, r, j),
                              **({"reason": not_compared_reason(math.prod(c.dims), name)} if nothing else {}),
                              **({"reason": unrep_reason(c, r, j)} if lab == noise.UNREP and c.unrep_reason else {}),
                              **({"reason": c.drift_reason} if lab == noise.DRIFT and c.drift_reason and count
                                 else {}),
                              **({"value_heads": list(range(h * c.group, (h + 1) * c.group))} if c.group > 1
                                 else {}), **_sum_split(c, r, j)})
        return {
            "schema": DIFF_JSON, "verdict": self.verdict, "mode": self.mode,
            "impl": self.impl, "sources": {"candidate": self.sources[0], "reference": self.sources[1]},
            "dump": self.dump, "files": self.files, "precision": self.precision, "device": self.device,
            "config": None if self.config is None else self.config.as_dict(),
            "chunks": self.chunks, "heads": self.heads, "drift_fails": self.drift_fails,
            "compared": self.counts(), "outputs_not_compared": self.outputs_not_compared,
            "not_provided": self.not_provided, "taps_not_provided": self.taps_not_provided,
            "nonfinite_inputs": self.nonfinite_inputs,
            "first_divergence": jsonable(first), "first_bug": jsonable(bug),
            "first_nonfinite": jsonable(self.first_nonfinite),
            "tensors": jsonable({n: {**t, "lead": self.tensor_lead(n) if t.get("failed") else None}
                                 for n, t in self.tensors.items()}),
            "origin": jsonable(self.origin), "origin_first_divergence": jsonable(self.origin_first),
            "amplification": jsonable(self.amplification),
            "min_tolerance": jsonable(self.min_tolerance()), "missing": self.missing,
            "scales": {n: {"scale": c.scale if compared else None,
                           "abs_floor": c.abs_floor if compared and not c.per_cell else None, "per_cell": c.per_cell,
                           "weighted_by": "exp(gc)" if c.weighted else None}
                       for n, c in self.cells.items() for compared in [bool((c.count > 0).any())]},
            "exponents": jsonable(self.exponents), "repeat": jsonable(self.repeat), "notes": self.notes,
            "knobs": self.knobs,
            "noise": {"k": noise.K_DRIFT, "abs": noise.DRIFT_ABS}, "cells_truncated": truncated, "cells": cells,
        }


def _num(x) -> float | None:
    v = float(x)
    return v if math.isfinite(v) else None  # JSON has no Infinity/NaN (as in run --json)


def jsonable(x):
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float):
        return _num(x)
    return x
