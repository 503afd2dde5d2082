"""``kdadbg diff``: where do the kernels first leave the float64 reference, per tap × chunk × head?

Three ways to get the two sides of a comparison:

* ``diff_dump(inputs, config)``: our kernels (with taps) against the chunked float64 reference;
* ``diff_dump(..., against=read_taps_file(path))``: another implementation's taps file against
  the reference (``state_layout``/``gate_units`` convert theirs first);
* ``diff_taps_files(a, b)``: two taps files, ``a`` playing the reference, no dump needed.

Every cell (tap, chunk, head) gets, in float64 over its valid elements (rows ``>= len`` of the
chunk masked on every chunk-row axis; rows and columns of ``[C,C]`` taps): fla's ratio
``RMS(ref - x) / (RMS(ref) + 1e-8)``, the max abs error and its index, the cosine and the count
of NaN/Inf. A cell passes when it is finite and ``max_abs <= 1e-6`` or ``ratio <= tol``
(:data:`kdadbg.tolerances.TAP_TOLERANCES`); a cell over its tolerance is labelled DRIFT or BUG against the noise
floor (:mod:`kdadbg.noise`). The verdict fails on a BUG cell (and, with ``drift_fails``, on a
DRIFT cell too): the first divergence is the first cell over its tolerance, whatever its label.

**Dataflow order** (:func:`dataflow_key`), the order in which the first divergence is searched:

1. ``fwd_prepare`` taps, chunk by chunk (chunks are independent), within a chunk in registry
   order ``gc gT b qd kd ki kr L INV Mqk``;
2. ``fwd_recurrence`` taps, sequence by sequence (sequences are independent), each sequence from
   its first chunk to its last, within a chunk ``S vcorr U``;
3. ``bwd_recurrence`` taps, sequence by sequence, each from its last chunk to its first, within a
   chunk ``dU dkr dMqk dvcorr dL dqd dkd dki db dgT`` and then ``dS`` (the gradient the chunk
   passes back is computed last);
4. ``bwd_prepare`` taps (``dgc``), chunk by chunk.

Within one (tap, chunk) the heads are independent: the worst failing head is named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from kdadbg_kernels.taps import REGISTRY, STAGES, TAP_NAMES, TapSelection

from . import noise
from .chunks import ChunkTable, chunk_table
from .config import KDAConfig, KDAInputs
from .errors import KdadbgError
from .metrics import ABS_PASS
from .tolerances import tap_tolerances

LN2 = math.log(2.0)
SCHEMA = 1

# fla's ratio per tap and precision. fp32: rounding level (``ki = kn exp(-gc)`` with gc near -80 loses
# ~1e-5 in fp32 by itself); bf16: fla's KDA thresholds, forward taps like ``o`` (5e-3), backward taps
# like ``dg`` (2e-2). Cells beyond them that the noise floor explains are DRIFT, not BUG.
# Taps in dataflow order within one chunk (dS last in the backward recurrence).
_BWD_REC = tuple(n for n in TAP_NAMES if REGISTRY[n].stage == "bwd_recurrence" and n != "dS") + ("dS",)
TAP_ORDER: tuple[str, ...] = tuple(n for n in TAP_NAMES if REGISTRY[n].stage.startswith("fwd")) + _BWD_REC + tuple(
    n for n in TAP_NAMES if REGISTRY[n].stage == "bwd_prepare")
_RANK = {n: i for i, n in enumerate(TAP_ORDER)}
STATE_TAPS = ("S", "dS")
MAX_JSON_CELLS = 200_000          # beyond this, --json lists only the cells over tolerance
GATE_TAPS = ("gc", "gT")          # log-decay: ×ln2 from log2 units
GATE_GRAD_TAPS = ("dgc", "dgT")   # gradients w.r.t. it: ÷ln2 from log2 units

# A kernel run: (inputs, config, precision, device, selection) -> (outputs, taps [n_sel_chunks, n_sel_heads, ...]).
Runner = Callable[[KDAInputs, KDAConfig, str, str, TapSelection], tuple[dict, dict]]
Progress = Callable[[str, int, int], None]


# chunks: what the order, the masks and the locations need to know about each global chunk id


@dataclass(frozen=True)
class ChunkInfo:
    """Per global chunk id: sequence, position in it, first token (as a taps file's ``chunk.start``:
    the packed index for varlen, the index within the batch row otherwise) and valid rows."""

    chunk_size: int
    seq: dict[int, int]
    t: dict[int, int]
    start: dict[int, int]
    length: dict[int, int]

    @staticmethod
    def from_table(ct: ChunkTable) -> "ChunkInfo":
        ids = range(ct.n_chunks)
        return ChunkInfo(ct.chunk_size, {c: int(ct.seq[c]) for c in ids}, {c: int(ct.t[c]) for c in ids},
                         {c: int(ct.export_start[c]) for c in ids}, {c: int(ct.length[c]) for c in ids})

    @staticmethod
    def from_file(f: dict, chunk_size: int) -> "ChunkInfo":
        ch = f["chunks"]
        ids = [int(i) for i in ch["index"]]
        seq = dict(zip(ids, (int(s) for s in ch["seq"])))
        t = {}
        seen: dict[int, int] = {}
        for c in sorted(ids):  # position among the file's chunks of that sequence (exact if it starts there)
            t[c] = seen.get(seq[c], 0)
            seen[seq[c]] = t[c] + 1
        return ChunkInfo(chunk_size, seq, t, dict(zip(ids, (int(s) for s in ch["start"]))),
                         dict(zip(ids, (int(s) for s in ch["len"]))))

    def seq_chunks(self, n: int) -> list[int]:
        return sorted(c for c, s in self.seq.items() if s == n)


def dataflow_key(tap: str, chunk: int, info: ChunkInfo) -> tuple:
    """Sort key of a (tap, chunk) cell in dataflow order (module docstring)."""
    stage = REGISTRY[tap].stage
    s = STAGES.index(stage)
    if stage == "fwd_recurrence":
        return (s, info.seq[chunk], chunk, _RANK[tap])
    if stage == "bwd_recurrence":
        return (s, info.seq[chunk], -chunk, _RANK[tap])
    return (s, chunk, _RANK[tap])


def valid_mask(name: str, lengths: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``[R, 1, *dims]`` bool: the elements of tap ``name`` inside each chunk's valid rows."""
    R = lengths.numel()
    m = torch.ones((R, 1, *dims), dtype=torch.bool)
    for axis in REGISTRY[name].row_dims:
        rows = torch.arange(dims[axis])
        shape = [1] * (2 + len(dims))
        shape[0], shape[2 + axis] = R, dims[axis]
        m = m & (rows[None, :] < lengths[:, None]).reshape(shape)
    return m


# cells


@dataclass
class TapCells:
    """Metrics of one tap over ``chunks`` (rows) × ``heads`` (columns); every tensor is ``[R, Hs]``."""

    name: str
    chunks: list[int]
    heads: list[int]
    dims: tuple[int, ...]
    tol: float
    ratio: torch.Tensor
    max_abs: torch.Tensor
    index: torch.Tensor          # flat index of the worst element within the chunk's tap
    cosine: torch.Tensor
    nonfinite: torch.Tensor
    kernel: torch.Tensor         # value at the worst element
    reference: torch.Tensor
    floor: torch.Tensor | None = None
    label: torch.Tensor | None = None

    @property
    def stage(self) -> str:
        return REGISTRY[self.name].stage

    @property
    def failing(self) -> torch.Tensor:
        return self.label != noise.OK


def cell_metrics(name: str, x: torch.Tensor, ref: torch.Tensor, lengths: torch.Tensor) -> dict[str, torch.Tensor]:
    """fla ratio, max abs (+ flat index, both values), cosine and NaN/Inf count per ``[R, Hs]`` cell.

    ``x``, ``ref``: ``[R, Hs, *per-chunk shape]``; ``lengths``: ``[R]`` valid rows. Non-finite values
    (in either side) make the ratio and max abs infinite; the worst element is then the first one.
    Computed on ``ref``'s device (large GPU taps stay there); the results are CPU tensors.
    """
    dev = ref.device
    x, ref = x.detach().to(dev, torch.float64), ref.detach().to(dev, torch.float64)
    R, Hs, dims = x.shape[0], x.shape[1], tuple(x.shape[2:])
    m = valid_mask(name, lengths.to("cpu", torch.long), dims).to(dev).expand(R, Hs, *dims).reshape(R, Hs, -1)
    xf, rf = x.reshape(R, Hs, -1), ref.reshape(R, Hs, -1)
    zero = torch.zeros((), dtype=torch.float64, device=dev)
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=dev)
    bad = m & ~(torch.isfinite(xf) & torch.isfinite(rf))
    good = m & ~bad
    n = m.sum(-1).clamp(min=1)
    err = torch.where(good, xf - rf, zero)
    r0 = torch.where(good, rf, zero)
    x0 = torch.where(good, xf, zero)
    nonfinite = bad.sum(-1)
    ratio = (err.pow(2).sum(-1) / n).sqrt() / ((r0.pow(2).sum(-1) / n).sqrt() + 1e-8)
    score = torch.where(bad, inf, err.abs())
    score = torch.where(m, score, torch.tensor(-1.0, dtype=torch.float64, device=dev))
    arg = score.argmax(-1)
    max_abs = err.abs().gather(-1, arg[..., None])[..., 0]
    den = x0.norm(dim=-1) * r0.norm(dim=-1)
    same = (x0.norm(dim=-1) == r0.norm(dim=-1)).to(torch.float64)
    cosine = torch.where(den > 0, (x0 * r0).sum(-1) / torch.where(den > 0, den, 1.0), same)
    out = {"ratio": torch.where(nonfinite > 0, inf, ratio), "max_abs": torch.where(nonfinite > 0, inf, max_abs),
           "index": arg, "cosine": cosine, "nonfinite": nonfinite,
           "kernel": xf.gather(-1, arg[..., None])[..., 0], "reference": rf.gather(-1, arg[..., None])[..., 0]}
    return {k: v.cpu() for k, v in out.items()}


def judge(cells: TapCells, floor: dict | None = None) -> TapCells:
    """Label every cell OK / DRIFT / BUG (``floor``: the noise run's metrics of the same cells)."""
    passed = (cells.nonfinite == 0) & ((cells.max_abs <= ABS_PASS) | (cells.ratio <= cells.tol))
    if floor is not None:
        cells.floor = floor["ratio"]
        cells.label = noise.classify(passed, cells.ratio, cells.nonfinite, floor["ratio"], floor["nonfinite"])
    else:
        cells.label = noise.classify(passed, cells.ratio, cells.nonfinite)
    return cells


def compare_taps(cand: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], chunks: list[int], heads: list[int],
                 info: ChunkInfo, tols: dict[str, float], floor: dict[str, torch.Tensor] | None = None
                 ) -> dict[str, TapCells]:
    """Cells of every tap present in both sides; each side ``[len(chunks), len(heads), *shape]``."""
    lengths = torch.tensor([info.length[c] for c in chunks], dtype=torch.long)
    out = {}
    for name in TAP_ORDER:
        if name not in cand or name not in ref:
            continue
        met = cell_metrics(name, cand[name], ref[name], lengths)
        cells = TapCells(name, list(chunks), list(heads), tuple(cand[name].shape[2:]), tols[name], **met)
        fl = None
        if floor is not None and name in floor:
            fm = cell_metrics(name, floor[name], ref[name], lengths)
            fl = {"ratio": fm["ratio"], "nonfinite": fm["nonfinite"]}
        out[name] = judge(cells, fl)
    return out


# the result


@dataclass
class DiffResult:
    mode: str                      # kernels | against | files
    sources: tuple[str, str]       # (candidate, reference) names: e.g. ("kernel", "reference")
    precision: str
    device: str | None
    dump: str | None
    config: KDAConfig | None
    info: ChunkInfo
    chunks: list[int]
    heads: list[int]
    cells: dict[str, TapCells]
    drift_fails: bool = False
    missing: dict = field(default_factory=dict)
    origin: dict | None = None
    amplification: list[dict] = field(default_factory=list)
    exponents: list[dict] = field(default_factory=list)
    repeat: dict | None = None
    notes: list[str] = field(default_factory=list)
    files: dict = field(default_factory=dict)

    # -- searching ------------------------------------------------------------------------------

    def order(self) -> list[tuple[str, int]]:
        """(tap, row) pairs in dataflow order; ``row`` indexes ``self.chunks``."""
        pairs = [(n, r) for n in self.cells for r in range(len(self.chunks))]
        return sorted(pairs, key=lambda p: dataflow_key(p[0], self.chunks[p[1]], self.info))

    def _first_cell(self, pick, head: int | None = None) -> tuple[str, int] | None:
        """(tap, row) of the first cell in dataflow order where ``pick(cells)`` ([R, Hs] bool) holds."""
        best = None
        for name, cells in self.cells.items():
            hit = pick(cells)
            if head is not None:
                if head not in cells.heads:
                    continue
                hit = hit[:, cells.heads.index(head)][:, None]
            rows = hit.any(1).nonzero().flatten().tolist()
            if rows:
                key, r = min((dataflow_key(name, self.chunks[r], self.info), r) for r in rows)
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
        return self.locate(name, self.chunks[r], cells.heads[int(score.argmax())])

    def _fails(self, cells: TapCells) -> torch.Tensor:
        return cells.label == noise.BUG if not self.drift_fails else cells.failing

    @property
    def first_divergence(self) -> dict | None:
        """The first cell over its tolerance in dataflow order (DRIFT or BUG), or None."""
        return self._first(lambda c: c.failing)

    @property
    def first_bug(self) -> dict | None:
        return self._first(lambda c: c.label == noise.BUG)

    @property
    def first_nonfinite(self) -> dict | None:
        return self._first(lambda c: c.nonfinite > 0)

    @property
    def passed(self) -> bool:
        return not any(bool(self._fails(c).any()) for c in self.cells.values())

    def locate(self, name: str, chunk: int, head: int) -> dict:
        """Everything about one cell, and where its worst element lives."""
        cells = self.cells[name]
        r, h = cells.chunks.index(chunk), cells.heads.index(head)
        tap = REGISTRY[name]
        index = [int(i) for i in torch.unravel_index(cells.index[r, h], cells.dims)] if cells.dims else []
        row = next((index[a] for a in tap.row_dims), None)
        axes = list(tap.shape)
        d = {"tap": name, "stage": tap.stage, "chunk": chunk, "head": head, "seq": self.info.seq[chunk],
             "chunk_in_seq": self.info.t[chunk], "row": row,
             "token": None if row is None else self.info.start[chunk] + row,
             "index": index, "axes": axes,
             "ratio": float(cells.ratio[r, h]), "max_abs": float(cells.max_abs[r, h]),
             "cosine": float(cells.cosine[r, h]), "nonfinite": int(cells.nonfinite[r, h]),
             "kernel": float(cells.kernel[r, h]), "reference": float(cells.reference[r, h]),
             "tol": cells.tol, "floor": None if cells.floor is None else float(cells.floor[r, h]),
             "label": noise.LABELS[int(cells.label[r, h])]}
        for axis, name_ in enumerate(tap.shape):
            if name_ in ("K", "V"):
                d[name_.lower()] = index[axis]
        return d

    def min_tolerance(self) -> dict[str, dict]:
        """Per tap: the smallest tolerance that would have passed every cell (its worst ratio) and where."""
        out = {}
        for name, cells in self.cells.items():
            r = cells.ratio
            flat = int(torch.nan_to_num(r, nan=math.inf).argmax())
            i, j = divmod(flat, r.shape[1])
            out[name] = {"tol": cells.tol, "min_tol": float(r.max()), "chunk": cells.chunks[i],
                         "head": cells.heads[j], "drift": int((cells.label == noise.DRIFT).sum()),
                         "bug": int((cells.label == noise.BUG).sum())}
        return out

    # -- views ------------------------------------------------------------------------------------

    def grid(self, max_columns: int = 24) -> dict:
        """The tap × chunk grid, chunks bucketed into at most ``max_columns`` columns; each cell is the
        worst (label, then ratio) over the bucket's chunks and every head, or None where nothing was compared."""
        n = len(self.chunks)
        per = max(1, math.ceil(n / max(1, max_columns)))
        buckets = [list(range(i, min(n, i + per))) for i in range(0, n, per)]
        rows = []
        for name in (t for t in TAP_ORDER if t in self.cells):
            cells = self.cells[name]
            out = []
            for b in buckets:
                lab, rat = cells.label[b].to(torch.float64), cells.ratio[b]
                score = lab * 1e300 + torch.nan_to_num(rat, posinf=1e299)
                flat = int(score.argmax())
                i, j = divmod(flat, len(cells.heads))
                out.append({"label": noise.LABELS[int(cells.label[b[i], j])], "ratio": float(cells.ratio[b[i], j]),
                            "nonfinite": int(cells.nonfinite[b].sum()), "chunk": self.chunks[b[i]],
                            "head": cells.heads[j]})
            rows.append({"tap": name, "stage": cells.stage, "cells": out})
        cols = [(self.chunks[b[0]], self.chunks[b[-1]]) for b in buckets]
        return {"columns": cols, "rows": rows, "bucket": per}

    def per_head(self) -> list[dict]:
        """Per head: worst ratio per stage, failing cells, and the first failing (tap, chunk)."""
        out = []
        for j, h in enumerate(self.heads):
            worst, fails = {}, 0
            for name, cells in self.cells.items():
                if h not in cells.heads:
                    continue
                jj = cells.heads.index(h)
                worst[cells.stage] = max(worst.get(cells.stage, 0.0), float(cells.ratio[:, jj].max()))
                fails += int(self._fails(cells)[:, jj].sum())
            found = self._first_cell(lambda c: c.failing, head=h)
            first = None if found is None else {"tap": found[0], "chunk": self.chunks[found[1]]}
            out.append({"head": h, "worst": worst, "failing": fails, "first": first})
        return out

    def heatmap(self) -> tuple[list[str], list[int], list[list[float | None]]]:
        """Rows (taps in dataflow order), columns (chunks) and log10 of the worst ratio over heads."""
        names = [t for t in TAP_ORDER if t in self.cells]
        vals = []
        for name in names:
            worst = self.cells[name].ratio.max(dim=1).values
            vals.append([math.log10(v) if v > 0 else -12.0 for v in worst.tolist()])
        return names, list(self.chunks), vals

    def as_json(self) -> dict:
        """The ``--json`` document (schema 1; README, section "kdadbg diff")."""
        first = self.first_divergence
        if first is not None:
            first = {**first, "origin": (self.origin or {}).get("verdict")}
        n_cells = sum(c.ratio.numel() for c in self.cells.values())
        truncated = n_cells > MAX_JSON_CELLS
        lists = {}
        for name, c in self.cells.items():
            idx = [[int(i) for i in torch.unravel_index(torch.tensor(f), c.dims)] if c.dims else []
                   for f in range(max(1, math.prod(c.dims)))]
            lists[name] = (c.ratio.tolist(), c.max_abs.tolist(), c.index.tolist(), c.cosine.tolist(),
                           c.nonfinite.tolist(), None if c.floor is None else c.floor.tolist(), c.label.tolist(), idx)
        cells = []
        for name, r in self.order():
            c = self.cells[name]
            ratio, max_abs, index, cosine, nonfinite, floor, label, idx = lists[name]
            chunk = self.chunks[r]
            for j, h in enumerate(c.heads):
                if truncated and label[r][j] == noise.OK:
                    continue
                cells.append({"tap": name, "stage": c.stage, "chunk": chunk, "head": h, "seq": self.info.seq[chunk],
                              "ratio": _num(ratio[r][j]), "max_abs": _num(max_abs[r][j]), "index": idx[index[r][j]],
                              "cosine": _num(cosine[r][j]), "nonfinite": nonfinite[r][j], "tol": c.tol,
                              "floor": None if floor is None else _num(floor[r][j]),
                              "label": noise.LABELS[label[r][j]]})
        fb, fn = self.first_bug, self.first_nonfinite
        return {
            "schema": SCHEMA, "verdict": "pass" if self.passed else "fail", "mode": self.mode,
            "sources": {"kernel": self.sources[0], "reference": self.sources[1]},
            "dump": self.dump, "files": self.files, "precision": self.precision, "device": self.device,
            "config": None if self.config is None else self.config.as_dict(),
            "chunks": self.chunks, "heads": self.heads, "drift_fails": self.drift_fails,
            "first_divergence": _jsonable(first), "first_bug": _jsonable(fb), "first_nonfinite": _jsonable(fn),
            "origin": _jsonable(self.origin), "amplification": _jsonable(self.amplification),
            "min_tolerance": _jsonable(self.min_tolerance()), "missing": self.missing,
            "exponents": _jsonable(self.exponents), "repeat": _jsonable(self.repeat), "notes": self.notes,
            "noise": {"k": noise.K_DRIFT, "abs": noise.DRIFT_ABS}, "cells_truncated": truncated, "cells": cells,
        }


def _num(x) -> float | None:
    v = float(x)
    return v if math.isfinite(v) else None  # JSON has no Infinity/NaN (as in run --json)


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float):
        return _num(x)
    return x


# conversions of another implementation's taps


def convert_theirs(taps: dict[str, torch.Tensor], state_layout: str = "kv", gate_units: str = "ln"
                   ) -> dict[str, torch.Tensor]:
    """Bring another implementation's taps to the registry's conventions.

    ``state_layout="vk"``: their ``S``/``dS`` are ``[V,K]``: transposed. ``gate_units="log2"``: their
    gates are ``G2 = Gn / ln2``, so ``gc, gT`` are multiplied by ln2 and, since
    ``dℓ/dG2 = ln2 · dℓ/dGn``, ``dgc, dgT`` are divided by ln2.
    """
    if state_layout not in ("kv", "vk"):
        raise KdadbgError(f"--state-layout: expected kv or vk, found {state_layout!r}")
    if gate_units not in ("ln", "log2"):
        raise KdadbgError(f"--gate-units: expected ln or log2, found {gate_units!r}")
    out = {}
    for name, t in taps.items():
        t = t.to(torch.float64)
        if state_layout == "vk" and name in STATE_TAPS:
            t = t.transpose(-1, -2)
        if gate_units == "log2" and name in GATE_TAPS:
            t = t * LN2
        if gate_units == "log2" and name in GATE_GRAD_TAPS:
            t = t / LN2
        out[name] = t.contiguous()
    return out


# diff against the reference


def _select(taps: dict[str, torch.Tensor], rows: list[int], heads: list[int]) -> dict[str, torch.Tensor]:
    """``taps[n][rows][:, heads]`` on each tap's own device."""
    out = {}
    for n, t in taps.items():
        ri = torch.tensor(rows, dtype=torch.long, device=t.device)
        hi = torch.tensor(heads, dtype=torch.long, device=t.device)
        out[n] = t.detach().index_select(0, ri).index_select(1, hi)
    return out


def _all_nan(t: torch.Tensor) -> bool:
    return t.numel() > 0 and bool(torch.isnan(t).all())


def diff_dump(inputs: KDAInputs, config: KDAConfig, *, dump: str | None = None, precision: str = "fp32",
              device: str = "cpu", names: tuple[str, ...] = TAP_NAMES, chunks: tuple[int, int] | None = None,
              heads: tuple[int, ...] | None = None, against: dict | None = None, state_layout: str = "kv",
              gate_units: str = "ln", tol_overrides: list[str] | None = None, noise_floor: bool = True,
              window: int = 3, repeat: int = 1, drift_fails: bool = False, runner: Runner | None = None,
              progress: Progress | None = None) -> DiffResult:
    """Diff our kernels' (or, with ``against``, another implementation's) taps against the reference.

    Args:
        inputs, config: a loaded dump (``kdadbg.dump.load_dump``).
        names: taps to compare; chunks: half-open global chunk range (None: all); heads: None: all.
        against: a taps file as read by ``kdadbg.tapsfile.read_taps_file``; its taps are converted
            with ``state_layout`` (``vk``: their S/dS are [V,K]) and ``gate_units`` (``log2``).
        noise_floor: label failing cells DRIFT or BUG against the float32 reference (see ``noise``).
        window: chunks in the made-here-or-carried-in rerun (kernels only; 0 skips it).
        repeat: run the kernels this many times and report the first tap × chunk whose bits differ.
        drift_fails: whether a DRIFT cell fails the verdict too (a BUG always does).
        runner: the kernels (default :func:`kdadbg.backend.kernel_taps`); tests pass stand-ins.
    Example:
        >>> inputs, config = load_dump("sample_inputs/basic.safetensors")
        >>> res = diff_dump(inputs, config, precision="fp32")
        >>> res.first_divergence   # None, or {"tap": "dL", "chunk": 3, "head": 0, ...}
    """
    from .reference import run_reference

    if runner is None:
        from .backend import kernel_taps as runner
    tols = tap_tolerances(precision, tol_overrides)
    B, T, H, K, V = inputs.shape
    ct = chunk_table(B, T, inputs.cu_seqlens, config.chunk_size)
    info = ChunkInfo.from_table(ct)
    lo, hi = (0, ct.n_chunks) if chunks is None else (max(0, chunks[0]), min(ct.n_chunks, chunks[1]))
    head_list = list(range(H)) if heads is None else list(heads)
    chunk_list = list(range(lo, hi))
    sel = TapSelection(names=tuple(names), chunks=(lo, hi), heads=tuple(head_list))
    missing = {"taps": [], "chunks": [], "heads": [], "not_written": []}

    stages: list[str] = []

    def step(stage):  # one bar per stage: the previous one completes
        if progress:
            if stages:
                progress(stages[-1], 1, 1)
            stages.append(stage)
            progress(stage, 0, 1)

    step("reference")
    ref_names = tuple(dict.fromkeys((*names, *GATE_TAPS, "S", "dS")))
    ref = run_reference(inputs, config, taps=ref_names, device=device)
    ref_taps = dict(ref.taps)

    rep = None
    if against is None:
        mode, sources = "kernels", ("kernel", "reference")
        runs = []
        for i in range(max(1, repeat)):
            step(f"kernels run {i + 1}" if repeat > 1 else "kernels")
            runs.append(runner(inputs, config, precision, device, sel))
        _, cand_sel = runs[0]
        cand = {}
        for n in names:
            t = cand_sel.get(n)
            if t is None or _all_nan(t):
                missing["not_written"].append(n)
            else:
                cand[n] = t.detach()
        rows, cand_heads = chunk_list, head_list
        cand_rows = list(range(len(chunk_list)))
        if repeat > 1:
            rep = _repeat_report(runs, chunk_list, head_list, info)
    else:
        mode, sources = "against", ("theirs", "reference")
        cand, rows, cand_heads, cand_rows = _file_side(against, info, config, K, V, names, chunk_list, head_list,
                                                       missing, state_layout, gate_units)
    ref_sel = _select({n: ref_taps[n] for n in cand}, rows, cand_heads)
    cand = {n: t.index_select(0, torch.tensor(cand_rows, dtype=torch.long, device=t.device))
            for n, t in cand.items()}

    floor = None
    if noise_floor:
        step("noise floor")
        fl = noise.floor_reference(inputs, config, precision, tuple(cand), device)
        floor = _select(fl, rows, cand_heads)

    cells = compare_taps(cand, ref_sel, rows, cand_heads, info, tols, floor)
    res = DiffResult(mode, sources, precision, device, dump, config, info, rows, cand_heads, cells,
                     drift_fails=drift_fails, missing=missing, repeat=rep)
    if against is not None:
        res.files = {"theirs": against["path"], "state_layout": state_layout, "gate_units": gate_units}
    res.exponents = exponent_ranges(ref_taps, info, rows, cand_heads)
    first = res.first_divergence
    if first is not None:
        res.amplification = amplification(res, first)
        if mode == "kernels" and window > 0:
            step("window rerun")
            res.origin = window_rerun(inputs, config, ref_taps, info, first, precision, device, runner, tols,
                                      window, drift_fails)
    if progress and stages:
        progress(stages[-1], 1, 1)
    return res


def _file_side(f: dict, info: ChunkInfo, config: KDAConfig, K: int, V: int, names, chunk_list, head_list, missing,
               state_layout, gate_units):
    """The taps of a file on the selected chunks × heads it holds; checks its chunk table against the dump's."""
    path = f["path"]
    meta_c = f["metadata"].get("chunk_size")
    if meta_c is not None and str(meta_c).strip() != str(config.chunk_size):
        raise KdadbgError(f"{path}: chunk_size {meta_c} in its metadata, but the dump uses {config.chunk_size}")
    ch = f["chunks"]
    if not ch:
        missing["taps"] = list(names)
        return {}, [], [], []
    file_ids = [int(i) for i in ch["index"]]
    for i, c in enumerate(file_ids):
        if c not in info.length:
            raise KdadbgError(f"{path}: chunk.index {c} out of range; the dump has {len(info.length)} chunks")
        if int(ch["len"][i]) != info.length[c] or int(ch["seq"][i]) != info.seq[c]:
            raise KdadbgError(f"{path}: chunk {c}: seq {int(ch['seq'][i])}, len {int(ch['len'][i])} in the file, "
                              f"but seq {info.seq[c]}, len {info.length[c]} in the dump (another chunk size or "
                              f"sequence layout?)")
    file_heads = [int(h) for h in f["heads"]]
    rows = [c for c in chunk_list if c in file_ids]
    heads = [h for h in head_list if h in file_heads]
    missing["chunks"] = [c for c in chunk_list if c not in file_ids]
    missing["heads"] = [h for h in head_list if h not in file_heads]
    missing["taps"] = [n for n in names if n not in f["taps"]]
    if not rows or not heads:
        return {}, [], [], []
    hi = torch.tensor([file_heads.index(h) for h in heads], dtype=torch.long)
    want = {"K": K, "V": V, "C": config.chunk_size}
    theirs = {}
    for n in names:
        if n not in f["taps"]:
            continue
        t = f["taps"][n].index_select(1, hi)
        shape = REGISTRY[n].dims(config.chunk_size, K, V)
        if state_layout == "vk" and n in STATE_TAPS:
            shape = shape[::-1]
        if tuple(t.shape[2:]) != tuple(shape):
            raise KdadbgError(f"{path}: tap.{n}: per-chunk shape {list(t.shape[2:])}, expected {list(shape)} "
                              f"(C={want['C']}, K={K}, V={V}, state layout {state_layout})")
        theirs[n] = t
    cand = convert_theirs(theirs, state_layout, gate_units)
    return cand, rows, heads, [file_ids.index(c) for c in rows]


# two taps files, no reference


def diff_taps_files(a: dict, b: dict, *, precision: str = "fp32", names: tuple[str, ...] = TAP_NAMES,
                    chunks: tuple[int, int] | None = None, heads: tuple[int, ...] | None = None,
                    state_layout: str = "kv", gate_units: str = "ln", tol_overrides: list[str] | None = None,
                    drift_fails: bool = False) -> DiffResult:
    """Compare taps file ``b`` (converted like ``--against``) to taps file ``a``, which plays the reference.

    No noise floor is available (no dump), so failing cells are BUG. Example:
    ``diff_taps_files(read_taps_file("ours.safetensors"), read_taps_file("theirs.safetensors"))``.
    """
    tols = tap_tolerances(precision, tol_overrides)
    for f in (a, b):
        if not f["chunks"]:
            raise KdadbgError(f"{f['path']}: holds no taps (no chunk table) to compare")
    try:
        C = int(a["metadata"].get("chunk_size") or b["metadata"].get("chunk_size") or 0)
    except ValueError:
        C = 0
    if C <= 0:
        C = max((t.shape[2] for n, t in a["taps"].items() if REGISTRY[n].shape[:1] == ("C",)), default=16)
    info = ChunkInfo.from_file(a, C)
    a_ids, b_ids = [int(i) for i in a["chunks"]["index"]], [int(i) for i in b["chunks"]["index"]]
    for i, c in enumerate(b_ids):
        if c in info.length and int(b["chunks"]["len"][i]) != info.length[c]:
            raise KdadbgError(f"{b['path']}: chunk {c} has len {int(b['chunks']['len'][i])}, but "
                              f"{info.length[c]} in {a['path']}")
    lo, hi = (min(a_ids), max(a_ids) + 1) if chunks is None else chunks
    want_chunks = [c for c in sorted(a_ids) if lo <= c < hi]
    a_heads, b_heads = [int(h) for h in a["heads"]], [int(h) for h in b["heads"]]
    want_heads = a_heads if heads is None else [h for h in heads]
    rows = [c for c in want_chunks if c in b_ids]
    hs = [h for h in want_heads if h in a_heads and h in b_heads]
    missing = {"taps": [n for n in names if n in a["taps"] and n not in b["taps"]],
               "chunks": [c for c in want_chunks if c not in b_ids],
               "heads": [h for h in want_heads if h not in hs],
               "not_in_reference_file": [n for n in names if n not in a["taps"]]}
    pick_a = {n: a["taps"][n] for n in names if n in a["taps"] and n in b["taps"]}
    pick_b = {n: b["taps"][n] for n in pick_a}
    cand = convert_theirs(pick_b, state_layout, gate_units)

    def sel(ids, hl, taps):
        ri = torch.tensor([ids.index(c) for c in rows], dtype=torch.long)
        hi_ = torch.tensor([hl.index(h) for h in hs], dtype=torch.long)
        return {n: t.to(torch.float64).index_select(0, ri).index_select(1, hi_) for n, t in taps.items()}

    cells = compare_taps(sel(b_ids, b_heads, cand), sel(a_ids, a_heads, pick_a), rows, hs, info, tols)
    res = DiffResult("files", (b["path"], a["path"]), precision, None, None, None, info, rows, hs, cells,
                     drift_fails=drift_fails, missing=missing,
                     files={"reference": a["path"], "theirs": b["path"], "state_layout": state_layout,
                            "gate_units": gate_units})
    res.notes.append("no dump: no noise floor (failing cells are BUG), no window rerun")
    first = res.first_divergence
    if first is not None:
        res.amplification = amplification(res, first)
    return res


# made here or carried in


def producer_chunk(tap: str, chunk: int, info: ChunkInfo) -> int:
    """The chunk whose computation writes ``tap`` of ``chunk``: ``S[c]`` is made by chunk ``c-1``'s state
    update (chunk ``c`` itself when it is its sequence's first: ``S = h0``); every other tap by ``c``."""
    if tap == "S" and info.t[chunk] > 0:
        return chunk - 1
    return chunk


def window_inputs(inputs: KDAInputs, config: KDAConfig, ref_taps: dict, info: ChunkInfo, first: int, last: int
                  ) -> KDAInputs:
    """One sequence's tokens from chunk ``first`` to the end of chunk ``last`` (same sequence), as a
    single-sequence dump: ``h0`` = the reference's ``S[first]``, ``dht`` = the reference's
    ``dS[last + 1]`` or the dump's ``dht`` when ``last`` ends the sequence (both in the dump's layout)."""
    B, T, H, K, V = inputs.shape
    n = info.seq[first]
    t0 = info.start[first] if inputs.cu_seqlens is not None else n * T + info.start[first]
    length = sum(info.length[c] for c in range(first, last + 1))

    def tok(x):
        if x is None:
            return None
        flat = x.reshape(B * T, *x.shape[2:])
        return flat[t0:t0 + length].unsqueeze(0).contiguous()

    def state(S):  # math [H,K,V] -> dump layout [1,H,*]
        S = S.to("cpu", torch.float32)
        return (S.transpose(-1, -2) if config.state_layout == "vk" else S).unsqueeze(0).contiguous()

    h0 = state(ref_taps["S"][first])
    seq_end = info.seq_chunks(n)[-1]
    if last == seq_end:
        dht = None if inputs.dht is None else inputs.dht[n:n + 1].clone()
    else:
        dht = state(ref_taps["dS"][last + 1])
    return KDAInputs(q=tok(inputs.q), k=tok(inputs.k), v=tok(inputs.v), g=tok(inputs.g), beta=tok(inputs.beta),
                     do=tok(inputs.do), dht=dht, h0=h0, cu_seqlens=None, A_log=inputs.A_log,
                     dt_bias=inputs.dt_bias)


def window_rerun(inputs: KDAInputs, config: KDAConfig, ref_taps: dict, info: ChunkInfo, first: dict,
                 precision: str, device: str, runner: Runner, tols: dict[str, float], window: int = 3,
                 drift_fails: bool = False) -> dict:
    """Rerun the kernels on a window starting at the diverging chunk, seeded from the reference.

    The window holds ``window`` chunks from the producer of the diverging tap (``S[c]``: chunk ``c-1``)
    or to the end of its sequence. If the diverging cell still fails there, its error was
    ``introduced`` by that chunk; if it passes, it was ``inherited`` from earlier chunks (forward) or
    later chunks (backward).
    """
    from .reference import run_reference

    tap, chunk, head = first["tap"], first["chunk"], first["head"]
    n = info.seq[chunk]
    start = producer_chunk(tap, chunk, info)
    seq_chunks = info.seq_chunks(n)
    last = min(seq_chunks[-1], max(chunk, start + max(1, window) - 1))
    w_in = window_inputs(inputs, config, ref_taps, info, start, last)
    names = tuple(TAP_ORDER)
    wref = run_reference(w_in, config, taps=names, device=device)
    nwc = last - start + 1
    sel = TapSelection(names=names, chunks=(0, nwc), heads=(head,))
    _, wtaps = runner(w_in, config, precision, device, sel)
    wct = chunk_table(1, w_in.shape[1], None, config.chunk_size)
    winfo = ChunkInfo.from_table(wct)
    wcand = {k: v.detach() for k, v in wtaps.items() if k in wref.taps and not _all_nan(v)}
    wrefs = _select({k: wref.taps[k] for k in wcand}, list(range(nwc)), [head])
    wcells = compare_taps(wcand, wrefs, list(range(nwc)), [head], winfo, tols)
    j = chunk - start
    d = {"window": [start, last], "seq": n, "head": head, "seeded": {
        "h0": f"reference S[{start}]",
        "dht": "the dump's dht" if last == seq_chunks[-1] else f"reference dS[{last + 1}]"}}
    if tap not in wcells:
        return {**d, "verdict": None, "reason": f"the kernels wrote no {tap} in the window"}
    c = wcells[tap]
    failing = bool(c.failing[j, 0])  # still over its tolerance, DRIFT or BUG
    wres = DiffResult("window", ("kernel", "reference"), precision, device, None, config, winfo, list(range(nwc)),
                      [head], wcells, drift_fails=drift_fails)
    wfirst = wres.first_divergence
    if wfirst is not None:
        wfirst = {**wfirst, "chunk": wfirst["chunk"] + start}
    return {**d, "verdict": "introduced" if bool(failing) else "inherited", "tap": tap, "chunk": chunk,
            "ratio": float(c.ratio[j, 0]), "tol": c.tol,
            "ratios": {k: [float(x) for x in v.ratio[:, 0]] for k, v in wcells.items()},
            "first_in_window": wfirst}


def amplification(res: DiffResult, first: dict) -> list[dict]:
    """Error growth along the diverging sequence for the diverging tap, ``S`` and ``dS`` (head of the
    divergence): per chunk in that tap's walk direction, from the divergence on (S and dS: the whole walk)."""
    n, head = first["seq"], first["head"]
    out = []
    for name in dict.fromkeys((first["tap"], "S", "dS")):
        if name not in res.cells or head not in res.cells[name].heads:
            continue
        cells = res.cells[name]
        j = cells.heads.index(head)
        seq_rows = [r for r, c in enumerate(res.chunks) if res.info.seq[c] == n]
        backward = cells.stage.startswith("bwd")
        seq_rows.sort(key=lambda r: -res.chunks[r] if backward else res.chunks[r])
        if name == first["tap"]:
            seq_rows = [r for r in seq_rows if (res.chunks[r] <= first["chunk"] if backward
                                                else res.chunks[r] >= first["chunk"])]
        ratios = [float(cells.ratio[r, j]) for r in seq_rows]
        growth = [(b / a if a > 0 and math.isfinite(a) and math.isfinite(b) else None)
                  for a, b in zip(ratios, ratios[1:])]
        out.append({"tap": name, "head": head, "direction": "backward" if backward else "forward",
                    "chunks": [res.chunks[r] for r in seq_rows], "ratios": ratios, "growth": growth})
    return out


# NaN / Inf: the exponent arguments per chunk


EXP_LIMIT_FP32 = math.log(torch.finfo(torch.float32).max)   # ≈ 88.72: exp overflows float32 beyond it


def exponent_ranges(ref_taps: dict, info: ChunkInfo, chunks: list[int], heads: list[int]) -> list[dict]:
    """Per chunk, over its valid rows and the given heads: the range of the arguments of every ``exp``
    the chunked algorithm takes (``gc`` in qd/kd, ``gT - gc`` in kr, ``-gc`` in ki, ``gT`` in the state
    decay), from the reference; ``overflow_fp32`` when one exceeds ln(max float32) ≈ 88.7."""
    if "gc" not in ref_taps or "gT" not in ref_taps or not chunks:
        return []
    sel = _select({"gc": ref_taps["gc"], "gT": ref_taps["gT"]}, chunks, heads)
    gc, gT = sel["gc"].to(torch.float64), sel["gT"].to(torch.float64)            # [R,Hs,C,K], [R,Hs,K]
    lengths = torch.tensor([info.length[c] for c in chunks], device=gc.device)
    valid = (torch.arange(gc.shape[2], device=gc.device)[None, :] < lengths[:, None])[:, None, :, None]

    def span(x):  # (min, max) over the valid rows of every head, per chunk
        inf = torch.tensor(float("inf"), dtype=x.dtype, device=x.device)
        lo = torch.where(valid, x, inf).amin(dim=(1, 2, 3))
        hi = torch.where(valid, x, -inf).amax(dim=(1, 2, 3))
        return list(zip(lo.tolist(), hi.tolist()))

    cols = {"gc": span(gc), "gT_minus_gc": span(gT[:, :, None, :] - gc), "neg_gc": span(-gc),
            "gT": list(zip(gT.amin(dim=(1, 2)).tolist(), gT.amax(dim=(1, 2)).tolist()))}
    out = []
    for i, c in enumerate(chunks):
        row = {"chunk": c, "seq": info.seq[c], **{k: list(v[i]) for k, v in cols.items()}}
        row["max_exponent"] = max(row["gc"][1], row["gT_minus_gc"][1], row["neg_gc"][1])
        row["overflow_fp32"] = row["max_exponent"] > EXP_LIMIT_FP32
        out.append(row)
    return out


# determinism


def _repeat_report(runs: list[tuple[dict, dict]], chunks: list[int], heads: list[int], info: ChunkInfo) -> dict:
    """The first tap × chunk (dataflow order) whose bits differ between run 1 and a later run."""
    base_out, base_taps = runs[0]
    pairs = sorted(((n, r) for n in base_taps if n in _RANK for r in range(len(chunks))),
                   key=lambda p: dataflow_key(p[0], chunks[p[1]], info))
    for i, (outs, taps) in enumerate(runs[1:], start=2):
        for name, r in pairs:
            a, b = base_taps[name][r], taps[name][r]
            diff = _bits_differ(a, b)
            if bool(diff.any()):
                per_head = diff.reshape(diff.shape[0], -1).any(-1)
                return {"runs": len(runs), "identical": False, "run": i, "tap": name, "chunk": chunks[r],
                        "head": heads[int(per_head.nonzero()[0])], "elements": int(diff.sum())}
        for name in base_out:
            if name in outs and bool(_bits_differ(base_out[name], outs[name]).any()):
                return {"runs": len(runs), "identical": False, "run": i, "tap": None, "output": name}
    return {"runs": len(runs), "identical": True}


def _bits_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.detach().to("cpu").contiguous(), b.detach().to("cpu").contiguous()
    if a.shape != b.shape or a.dtype != b.dtype:
        return torch.ones(a.shape, dtype=torch.bool)
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.view(ints) != b.view(ints)


def write_plot(res: DiffResult, path) -> dict:
    """``--plot``: the tap × chunk heatmap (:func:`kdadbg.render.plot.plot_diff`) as a PNG."""
    from .render.plot import diff_plot_data, plot_diff

    data = diff_plot_data(res)
    out = plot_diff(path, data)
    return {"path": str(out), "rows": [r["name"] for r in data["rows"]],
            "chunks": [data["chunks"][0], data["chunks"][-1]]}


def is_taps_file(path) -> bool:
    """Whether ``path`` is a taps file (metadata ``format`` = kdadbg-taps-v1) rather than a dump."""
    from safetensors import safe_open

    from .fileio import read_safetensors
    from .tapsfile import FORMAT

    try:
        with safe_open(str(path), framework="pt") as f:  # the metadata only, no tensor is read
            meta = f.metadata() or {}
    except Exception:
        read_safetensors(path)  # raises the one-line error for a missing or unreadable file
        raise
    return meta.get("format") == FORMAT


def diff_paths(paths: list, *, against=None, overrides: dict | None = None, device: str = "auto",
               precision: str = "fp32", names: tuple[str, ...] = TAP_NAMES,
               chunks: tuple[int | None, int | None] | None = None, heads: tuple[int, ...] | None = None,
               state_layout: str = "kv", gate_units: str = "ln", tol_overrides: list[str] | None = None,
               window: int = 3, repeat: int = 1, drift_fails: bool = False, noise_floor: bool = True,
               allow_nonfinite: bool = False, progress: Progress | None = None) -> DiffResult:
    """What ``kdadbg diff`` computes: ``[DUMP]`` (kernels, or ``against`` a taps file) or ``[A, B]`` (taps files).

    Example: ``diff_paths(["sample_inputs/basic.safetensors"], precision="bf16").first_divergence``.
    """
    from .dump import load_dump
    from .export import resolve_device
    from .selection import resolve_selection
    from .tapsfile import read_taps_file

    if repeat < 1:
        raise KdadbgError(f"--repeat: expected at least 1, found {repeat}")
    if window < 0:
        raise KdadbgError(f"--window: expected 0 (off) or more chunks, found {window}")
    if len(paths) == 2:
        if against is not None:
            raise KdadbgError("--against: not with two taps files (A B already names both sides)")
        for p in paths:
            if not is_taps_file(p):
                raise KdadbgError(f"{p}: not a taps file (kdadbg taps writes them); diff A B compares two taps files")
        a, b = read_taps_file(paths[0]), read_taps_file(paths[1], state_layout)
        lo_hi = None
        if chunks is not None:
            lo_hi = (chunks[0] or 0, chunks[1] if chunks[1] is not None else 1 << 62)
        return diff_taps_files(a, b, precision=precision, names=names, chunks=lo_hi, heads=heads,
                               state_layout=state_layout, gate_units=gate_units, tol_overrides=tol_overrides,
                               drift_fails=drift_fails)
    if len(paths) != 1:
        raise KdadbgError(f"expected DUMP or two taps files A B, found {len(paths)} paths")
    path = paths[0]
    if is_taps_file(path):
        raise KdadbgError(f"{path}: is a taps file; diff needs the DUMP it came from (with --against TAPS), "
                          f"or a second taps file")
    inputs, config = load_dump(path, overrides, allow_nonfinite=allow_nonfinite)
    B, T, H, K, V = inputs.shape
    table = chunk_table(B, T, inputs.cu_seqlens, config.chunk_size)
    sel = resolve_selection(names, chunks, heads, table.n_chunks, H)
    f = read_taps_file(against, state_layout) if against is not None else None
    if f is not None and repeat > 1:
        raise KdadbgError("--repeat: runs our kernels; not with --against")
    dev = resolve_device(device)
    return diff_dump(inputs, config, dump=str(path), precision=precision, device=dev, names=sel.names,
                     chunks=sel.chunks, heads=sel.heads, against=f, state_layout=state_layout,
                     gate_units=gate_units, tol_overrides=tol_overrides, noise_floor=noise_floor, window=window,
                     repeat=repeat, drift_fails=drift_fails, progress=progress)
