"""Figures for ``--plot FILE.png``: the diff's tap × chunk heatmap and the run's ratio per tensor.

:func:`plot_diff` and :func:`plot_run` take plain data (dicts, lists, numbers, strings), so any
producer of results can feed them; :func:`diff_plot_data` and :func:`run_plot_data` build that data
from a ``kdadbg.diff.DiffResult`` and a ``kdadbg.run.RunResult``. matplotlib (the ``plot`` extra) is
imported only when a figure is drawn, through its Agg canvas: no pyplot, no global backend switch.

Reading the diff figure: one row per tap in dataflow order (stages separated by lines and named on
the right), one column per chunk (buckets of chunks, worst cell each, beyond 64 columns). The colour
is the worst head's ratio on a log scale: blue within every row's tolerance, a pale band over the
span of the tolerances (marked on the colour bar), yellow to red over them. The colour never
contradicts the status: an OK cell is drawn at most in the band's top bin (one passing on the
absolute rule, its ratio over its tolerance, at its tolerance, with a small dot), a DRIFT or BUG cell
at least in the first yellow bin. Each row's label names its tolerance; cells over it carry a marker,
``x`` BUG and ``o`` DRIFT; the first divergence is boxed and named with its head. Magenta: NaN/Inf;
grey: not compared; hatched white: unrepresentable (the implementation has no such tap in its
conventions).
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import KdadbgError
from . import id_ranges
from .difftables import _head

STATUSES = ("ok", "drift", "bug", "nonfinite", "not_compared", "unrepresentable")
# a bucket shows its worst: an UNREP cell (whose ratio, over its tolerance, the bucket takes) over an OK one
SEVERITY = {"not_compared": 0, "ok": 1, "unrepresentable": 2, "drift": 3, "bug": 4, "nonfinite": 5}
LABELS = {"ok": "OK", "drift": "DRIFT", "bug": "BUG", "nonfinite": "NaN/Inf", "not_compared": "not compared"}
MAX_COLUMNS = 64
# the colour map: N_LOW blue bins, N_BAND pale bins (the span of the rows' tolerances), yellow to red above;
# BAND's edges fall on bin edges, so the norm's tolerance span is exactly the pale bins
N_BINS, N_LOW, N_BAND = 256, 118, 20
BAND = (N_LOW / N_BINS, (N_LOW + N_BAND) / N_BINS)
MISSING = "--plot needs matplotlib: pip install matplotlib (in a kdadbg checkout: pip install -e '.[plot]')"

NONFINITE = "#ff00ff"
NOT_COMPARED = "#bdbdbd"
UNREPRESENTABLE = "#ffffff"
ABSOLUTE = "#555555"    # the dot of an OK cell passing on the absolute rule
PASS, FAIL = "#4c9f50", "#d62728"
UNREP_BAR = "#9e9e9e"   # kdadbg run: over the tolerance where the implementation's 16-bit storage explains it


def _matplotlib():
    """``(Figure, FigureCanvasAgg)``, or the one-line error when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise KdadbgError(MISSING) from None
    return Figure, FigureCanvasAgg


def require_matplotlib() -> None:
    """Fail early (before any compute) when ``--plot`` cannot be drawn."""
    _matplotlib()


def check_plot(path) -> None:
    """Before any compute: refuse a ``--plot`` path not named ``.png`` (``outputs.check_plot_name``), then a
    missing matplotlib."""
    from ..outputs import check_plot_name

    check_plot_name(path)
    _matplotlib()


def _target(path) -> Path:
    path = Path(path)
    if path.is_dir() or not (path.parent if str(path.parent) else Path(".")).is_dir():
        raise KdadbgError(f"--plot {path}: expected a file path in an existing folder")
    return path


def _save(fig, canvas_cls, path: Path) -> Path:
    canvas_cls(fig)
    fig.savefig(path, format="png", dpi=fig.dpi)
    return path


def _sci(x: float) -> str:
    """``3e-05`` -> ``3e-5``."""
    m, e = f"{x:.0e}".split("e")
    return f"{m}e{int(e)}"


SEP = "  ·  "     # between the parts of a title: where a line is broken first


def fit_title(fig, canvas_cls, text: str, fontsize: float) -> str:
    """``text`` broken into lines that each fit the figure's width, measured with its renderer at
    ``fontsize``: a line is broken at its ``SEP`` first, then at spaces (a count stays with its label,
    ``"4 UNREP"``); a word still wider than the figure (a long dump path) keeps its file name and loses
    the middle of its folders to an ellipsis (the full path is in the text report and the JSON). Draw it
    with ``parse_math=False``: a ``$`` in a path is not mathtext.
    Example: ``fig.suptitle(fit_title(fig, FigureCanvasAgg, "kdadbg run: /a/long/path/d.safetensors", 10))``."""
    import re

    from matplotlib.font_manager import FontProperties

    renderer = canvas_cls(fig).get_renderer()
    prop = FontProperties(size=fontsize)
    room = fig.bbox.width - 0.2 * fig.dpi    # the constrained layout's margins, and a little to spare

    def fits(line: str) -> bool:
        return renderer.get_text_width_height_descent(line, prop, ismath=False)[0] <= room

    lines: list[str] = []

    def pack(parts: list[str], joint: str, split) -> str | None:
        """Append the full lines of ``parts`` joined by ``joint`` to ``lines``; return the last, unfinished one."""
        cur = None
        for part in parts:
            if cur is not None and fits(cur + joint + part):
                cur += joint + part
                continue
            if cur is not None:
                lines.append(cur)
            cur = part if fits(part) else split(part)
        return cur

    def words(part: str) -> str:
        return pack(part.split(" "), " ", lambda word: _shorten(word, fits))

    for line in re.sub(r"(\d) (?=[A-Za-z])", "\\1\u00a0", text).split("\n"):
        lines.append(pack(line.split(SEP), SEP, words) or "")
    return "\n".join(lines)


def _shorten(word: str, fits) -> str:
    """``word`` with its middle cut to an ellipsis until it fits: the file name (after the last ``/``) kept
    whole where it fits alone, else both ends of the word."""
    cut = word.rfind("/")
    tail = word[cut:] if cut > 0 else ""
    if tail and fits("…" + tail):
        return next(word[:k] + "…" + tail for k in range(cut - 1, -1, -1) if fits(word[:k] + "…" + tail))
    return next((word[:k] + "…" + word[-k:] for k in range(len(word) // 2, 0, -1)
                 if fits(word[:k] + "…" + word[-k:])), "…")


# the diff heatmap


def bucket_columns(chunks: list[int], log10_ratio: list[list], status: list[list[str]],
                   max_columns: int = MAX_COLUMNS) -> tuple[list[str], list[list], list[list[str]], int, list[range]]:
    """Merge columns into buckets of a power-of-two size so that at most ``max_columns`` remain; each
    bucket keeps its worst status and the largest log10 ratio of the cells of that status (a DRIFT bucket
    is not coloured by an OK cell's ratio, one passing on the absolute rule far over its tolerance).
    Returns labels (``"0-15"``), values, statuses, the bucket size and the column range of each bucket."""
    n = len(chunks)
    per = 1
    while math.ceil(n / per) > max_columns:
        per *= 2
    groups = [range(i, min(n, i + per)) for i in range(0, n, per)]
    labels = [str(chunks[g[0]]) if len(g) == 1 else f"{chunks[g[0]]}-{chunks[g[-1]]}" for g in groups]
    stats = [[max((row[j] for j in g), key=SEVERITY.__getitem__) for g in groups] for row in status]
    vals = [[max((v[j] for j in g if v[j] is not None and s[j] == worst), default=None)
             for g, worst in zip(groups, s_row)] for v, s, s_row in zip(log10_ratio, status, stats)]
    return labels, vals, stats, per, groups


def _check_diff(data: dict) -> None:
    rows, chunks = data["rows"], data["chunks"]
    if not rows or not chunks:
        raise KdadbgError("--plot: nothing to plot (no tap or no chunk)")
    for key in ("log10_ratio", "status"):
        grid = data[key]
        if len(grid) != len(rows) or any(len(r) != len(chunks) for r in grid):
            raise ValueError(f"plot data {key}: expected {len(rows)} rows of {len(chunks)} columns")
    bad = {s for r in data["status"] for s in r} - set(STATUSES)
    if bad:
        raise ValueError(f"plot data status: unknown {sorted(bad)}; expected {STATUSES}")


def _norm(values: list[float], tols: list[float]):
    """A piecewise-linear norm, in decades: from at most 5 decades below the smallest tolerance (exact
    zeros would squash the rest) to the largest value or 1; the span of the rows' tolerances maps to
    the neutral band in the middle, so blue is within every tolerance and yellow to red over every one."""
    import numpy as np
    from matplotlib.colors import FuncNorm

    t_lo, t_hi = math.log10(min(tols)), math.log10(max(tols))
    if t_hi - t_lo < 0.04:
        t_lo, t_hi = t_lo - 0.02, t_hi + 0.02
    vmin = math.floor(max(t_lo - 5.0, min([t_lo - 2.0, *values])))
    vmax = math.ceil(max([0.0, t_hi + 1.0, *values]))
    xp, fp = [vmin, t_lo, t_hi, vmax], [0.0, BAND[0], BAND[1], 1.0]
    return FuncNorm((lambda x: np.interp(x, xp, fp), lambda y: np.interp(y, fp, xp)), vmin=vmin, vmax=vmax)


def _colourmap():
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap

    low, high = colormaps["Blues_r"], colormaps["YlOrRd"]
    n_high = N_BINS - N_LOW - N_BAND
    return ListedColormap([low(0.1 + 0.72 * i / (N_LOW - 1)) for i in range(N_LOW)] + ["#f4f4f4"] * N_BAND
                          + [high(0.2 + 0.8 * i / (n_high - 1)) for i in range(n_high)], name="kdadbg_tol")


def _bin(norm, v: float, tol: float, status: str) -> int:
    """The colour-map bin of a cell of log10 ratio ``v``, its row's tolerance ``tol``: an OK cell is drawn at
    most at its tolerance and never above the pale band (rounding at the band's top edge would make it the
    first yellow bin), a DRIFT or BUG cell at least in the first yellow bin (its row's tolerance may lie
    under the band's top; rounding at the edge would make it pale)."""
    if status == "ok":
        v = min(v, math.log10(tol))
    x = float(norm(min(max(v, norm.vmin), norm.vmax)))
    b = min(N_BINS - 1, max(0, int(x * N_BINS)))
    if status == "ok":
        return min(b, N_LOW + N_BAND - 1)
    if status in ("drift", "bug"):
        return max(b, N_LOW + N_BAND)
    return b


def absolute_pass(v, tol: float, status: str) -> bool:
    """An OK cell over its tolerance: it passed on the absolute rule (max |err| within ``1e-6 ×`` the
    quantity's scale, fla's rule for near-zero values)."""
    return status == "ok" and v is not None and math.isfinite(v) and v > math.log10(tol)


def plot_diff(path, data: dict) -> Path:
    """Draw the tap × chunk heatmap of one diff to ``path`` (PNG).

    Args:
        data: ``{"title": str, "rows": [{"name", "stage", "tol"}] (dataflow order), "chunks": [global
            chunk id per column], "log10_ratio": [[float | None per column] per row] (worst head),
            "status": [[one of STATUSES per column] per row], "first": {"row": i, "col": j, "head": int
            (optional), "value_heads": [int] (optional: dq/dk under GVA, ``head`` a q/k head)} | None,
            "no_divergence": the subtitle when ``first`` is None (optional), "compared": what was compared,
            under the first divergence (optional)}``.
    Example: ``plot_diff("d.png", diff_plot_data(res))``.
    """
    Figure, Canvas = _matplotlib()
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import to_rgba
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.transforms import blended_transform_factory

    _check_diff(data)
    path = _target(path)
    rows = data["rows"]
    labels, vals, stats, per, groups = bucket_columns(data["chunks"], data["log10_ratio"], data["status"])
    n_rows, n_cols = len(rows), len(labels)
    tols = [float(r["tol"]) for r in rows]
    finite = [v for row in vals for v in row if v is not None and math.isfinite(v)]
    norm, cmap = _norm(finite, tols), _colourmap()
    vmin, vmax = norm.vmin, norm.vmax

    width = min(22.0, max(9.0, 4.2 + 0.2 * n_cols))
    height = max(4.5, 2.4 + 0.27 * n_rows)
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    image = [[NOT_COMPARED] * n_cols for _ in range(n_rows)]
    hatched, grey, absolute = [], False, []
    for i in range(n_rows):
        for j in range(n_cols):
            s, v = stats[i][j], vals[i][j]
            if s == "nonfinite":
                image[i][j] = NONFINITE
            elif s == "not_compared" or (v is None and s != "unrepresentable"):
                image[i][j], grey = NOT_COMPARED, True
            elif s == "unrepresentable":
                image[i][j] = UNREPRESENTABLE
                hatched.append((i, j))
            else:
                image[i][j] = cmap(_bin(norm, v, tols[i], s))
                if absolute_pass(v, tols[i], s):
                    absolute.append((j, i))
    ax.imshow([[to_rgba(c) for c in r] for r in image], aspect="auto", interpolation="nearest")
    for i, j in hatched:
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="////", edgecolor="#888888", lw=0))
    marks = {k: ([j for i in range(n_rows) for j in range(n_cols) if stats[i][j] == k],
                 [i for i in range(n_rows) for j in range(n_cols) if stats[i][j] == k]) for k in ("bug", "drift")}
    size = max(10.0, min(40.0, 900.0 / max(n_cols, n_rows)))
    ax.scatter(*marks["bug"], marker="x", s=size, c="black", linewidths=1.3)
    ax.scatter(*marks["drift"], marker="o", s=size, facecolors="none", edgecolors="black", linewidths=1.0)
    if absolute:
        ax.scatter(*zip(*absolute), marker="o", s=size / 3, c=ABSOLUTE, linewidths=0)

    stages = [r["stage"] for r in rows]
    trans = blended_transform_factory(ax.transAxes, ax.transData)
    start = 0
    for i in range(1, n_rows + 1):
        if i == n_rows or stages[i] != stages[start]:
            if i < n_rows:
                ax.axhline(i - 0.5, color="black", lw=1.6)
            ax.text(1.01, (start + i - 1) / 2, stages[start].replace("_", " "), transform=trans, ha="left",
                    va="center", fontsize=9, fontweight="bold")
            start = i
    ax.set_yticks(range(n_rows), [f"{r['name']}  ≤{_sci(t)}" for r, t in zip(rows, tols)], fontsize=8,
                  family="monospace")
    stride = max(1, math.ceil(n_cols / 40))
    ax.set_xticks(range(0, n_cols, stride), labels[::stride], fontsize=8,
                  rotation=90 if per > 1 or n_cols > 24 else 0)
    ax.set_xlabel("chunk (global id)" if per == 1 else f"chunks (global ids), worst cell of each bucket of {per}")
    ax.set_ylabel("tap (dataflow order)  ≤ tolerance")
    ax.tick_params(length=0)
    ax.set_xticks([j - 0.5 for j in range(1, n_cols)], minor=True)
    ax.grid(which="minor", axis="x", color="white", lw=0.3)

    first, subtitle = data.get("first"), data.get("no_divergence", "no cell over its tolerance")
    if first is not None:
        i, j = first["row"], next(b for b, g in enumerate(groups) if first["col"] in g)
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", lw=3.0))
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="white", lw=1.0))
        status = data["status"][i][first["col"]]
        head = f", {_head(first)}" if first.get("head") is not None else ""
        subtitle = (f"{first.get('what', 'first divergence')}: {rows[i]['name']} ({rows[i]['stage']}) at chunk "
                    f"{data['chunks'][first['col']]}{head}: {LABELS.get(status, status)}{first.get('after', '')}"
                    + (f"\n{data['compared']}" if data.get("compared") else ""))
    fig.suptitle(fit_title(fig, Canvas, f"{data['title']}\n{subtitle}", 11), fontsize=11, parse_math=False)

    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.05, fraction=0.035, aspect=30)
    ticks = list(range(int(vmin), int(vmax) + 1))
    bar.set_ticks(ticks)
    # two short lines: one long line ran past the top of a short figure's colour bar (a user trial)
    bar.set_label("ratio RMS(err)/RMS(ref)\nworst head, log scale", fontsize=9)
    bar.ax.set_yticklabels([f"≤1e{ticks[0]}", *(f"1e{t}" for t in ticks[1:])], fontsize=8)
    tol_text = " … ".join(dict.fromkeys(_sci(t) for t in (min(tols), max(tols))))
    mid = (math.log10(min(tols)) + math.log10(max(tols))) / 2
    bar.ax.text(-0.3, mid, "tolerance", transform=blended_transform_factory(bar.ax.transAxes, bar.ax.transData),
                ha="right", va="center", fontsize=8)
    present = {s for r in stats for s in r}
    handles = [Patch(facecolor=cmap(0.5), edgecolor="#888888", label=f"tolerance band {tol_text} (each row's: left)")]
    if "bug" in present:
        handles.append(Line2D([], [], marker="x", ls="", color="black", label="BUG: over tolerance, beyond noise"))
    if "drift" in present:
        handles.append(Line2D([], [], marker="o", ls="", mfc="none", color="black",
                              label="DRIFT: over tolerance, within noise"))
    if absolute:
        handles.append(Line2D([], [], marker="o", ms=3.5, ls="", color=ABSOLUTE, label="OK on the absolute rule "
                              "(max |err| ≤ 1e-6 × scale): ratio over its tol, drawn at it"))
    if first is not None:
        handles.append(Patch(facecolor="none", edgecolor="black", lw=2.5, label=first.get("what", "first divergence")))
    if "nonfinite" in present:
        handles.append(Patch(facecolor=NONFINITE, label="NaN/Inf"))
    if grey:
        # ht/dh0 rows hold a value at a sequence's last/first chunk only: grey elsewhere, as in the text grid's ·
        handles.append(Patch(facecolor=NOT_COMPARED, label="not compared (not provided or not selected; ht, dh0: "
                                                           "only a sequence's last, first chunk)"))
    if "unrepresentable" in present:
        handles.append(Patch(facecolor=UNREPRESENTABLE, edgecolor="#888888", hatch="////", label="unrepresentable"))
    # as many columns as the figure's width holds (8-point text: about 0.065 inch a character, 0.5 inch for the
    # marker and gap): a legend wider than the figure is cut at both edges
    per_col = max(len(h.get_label()) for h in handles) * 0.065 + 0.5
    ncol = max(1, min(4, len(handles), int(fig.get_figwidth() // per_col)))
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize=8, frameon=False)
    return _save(fig, Canvas, path)


def diff_plot_data(res) -> dict:
    """The :func:`plot_diff` data of a :class:`kdadbg.compare.DiffResult`: taps and output rows in
    dataflow order (taps the diff could not compare, missing from a file or not written, as
    ``not_compared`` rows; per-head gradients are not chunk rows and are left out), the compared chunks
    and those missing from a file, each cell's worst head."""
    from .. import noise
    from ..compare import ORDER, QUANTITIES
    from ..diff import cell_tolerances

    missing = res.missing or {}
    absent = {n for key in ("taps", "not_written", "not_in_reference_file") for n in missing.get(key, ())}
    names = [n for n in ORDER if (n in res.cells or n in absent) and QUANTITIES[n].kind != "head"]
    chunks = sorted(set(res.chunks) | set(missing.get("chunks", ())))
    tols = cell_tolerances(res.precision, None)
    rows, values, status = [], [], []
    for name in names:
        cells = res.cells.get(name)
        rows.append({"name": name, "stage": QUANTITIES[name].stage, "tol": cells.tol if cells else tols[name]})
        v_row, s_row = [None] * len(chunks), ["not_compared"] * len(chunks)
        if cells is not None:
            import torch

            compared = cells.count > 0      # a head with nothing compared has no ratio and no label
            worst = torch.where(compared, cells.ratio, -math.inf).max(dim=1).values.tolist()
            rank = torch.where(cells.label == noise.UNREP, 0.5, cells.label.to(torch.float64))  # UNREP under DRIFT
            rank = torch.where(compared, rank, -1.0)
            best = rank.argmax(dim=1)
            label = cells.label.gather(1, best[:, None])[:, 0].tolist()
            nonfinite = (cells.nonfinite > 0).any(dim=1).tolist()
            for r, c in enumerate(cells.chunks):
                j = chunks.index(c)
                if not bool(compared[r].any()):
                    continue        # not_compared, grey
                lab = noise.LABELS[int(label[r])]
                s_row[j] = ("unrepresentable" if lab == "UNREP" else "nonfinite" if nonfinite[r] else lab.lower())
                v_row[j] = None if nonfinite[r] or not math.isfinite(worst[r]) else math.log10(max(worst[r], 1e-16))
        values.append(v_row)
        status.append(s_row)
    fd = res.focus   # the first BUG where there is one (what the text's rerun and amplification follow)
    first = None
    if fd is not None and fd["tap"] in names and fd["chunk"] in chunks:
        first = {"row": names.index(fd["tap"]), "col": chunks.index(fd["chunk"]), "head": fd["head"],
                 **({"value_heads": fd["value_heads"]} if fd.get("value_heads") else {})}
        div = res.first_divergence
        if (div["tap"], div["chunk"], div["head"]) != (fd["tap"], fd["chunk"], fd["head"]):
            first["what"] = "first BUG"
            where = "every chunk" if div["chunk"] is None else f"chunk {div['chunk']}"
            first["after"] = f" (first divergence: {div['tap']} at {where}, {_head(div)}, {div['label']})"
    if res.dump:
        title = f"kdadbg diff: {res.dump}  ·  {res.sources[0]} vs {res.sources[1]}  ·  {res.precision}"
    else:   # two taps files: the sources are the files (named once)
        title = f"kdadbg diff: {res.sources[0]} vs {res.sources[1]}  ·  {res.precision}"
    # the selection, as the text header names it (rows are the taps compared, columns the chunks)
    title += (f"  ·  chunks {res.chunks[0]}:{res.chunks[-1] + 1}" if res.chunks else "  ·  no chunks") + (
        f", heads {id_ranges(res.heads, ',')}")
    from .difftables import compared_line, no_divergence

    n = res.counts()
    subtitle = no_divergence(n, markup=False)
    compared = compared_line(n)
    if res.tensors_failing:   # DRIFT cells adding up to a tensor over its bar: the verdict fails with it
        compared += f"; over tolerance as whole tensors: {', '.join(res.tensors_failing)}"
    if res.verdict == "partial":   # nothing failed, but not a full pass: the picture says so too
        subtitle += f"\nPARTIAL (not a full pass): {', '.join(res.missing_outputs)} not provided"
    return {"title": title, "rows": rows, "chunks": chunks, "log10_ratio": values, "status": status, "first": first,
            "no_divergence": subtitle, "compared": compared}


# the run bars


def plot_run(path, data: dict) -> Path:
    """Draw one bar per tensor, its ratio on a log scale against its tolerance, to ``path`` (PNG).

    Args:
        data: ``{"title": str, "tensors": [{"name", "ratio": float | None (None: not finite), "tol",
            "passed": bool | None (None: nothing compared, a grey bar), "nonfinite": int, "unrep": bool
            (optional: UNREP, grey)}]}``; the title's last line may give the verdict.
    Example: ``plot_run("r.png", run_plot_data(result))``.
    """
    Figure, Canvas = _matplotlib()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    tensors = data["tensors"]
    if not tensors:
        raise KdadbgError("--plot: nothing to plot (no tensor)")
    path = _target(path)
    finite = [t["ratio"] for t in tensors if t["ratio"] is not None and t["ratio"] > 0]
    tols = [t["tol"] for t in tensors if t.get("tol")]
    lo = 10.0 ** (math.floor(math.log10(min([*finite, *tols]))) - 1)
    hi = 10.0 ** math.ceil(math.log10(max([*finite, *tols, 1.0]) * 3))
    fig = Figure(figsize=(8.5, max(3.2, 1.6 + 0.38 * len(tensors))), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.set_xscale("log")
    for y, t in enumerate(tensors):
        if t["passed"] is None:   # nothing compared: no bar, no verdict
            ax.barh(y, hi - lo, left=lo, height=0.62, color=NOT_COMPARED)
            if t.get("tol"):
                ax.plot([t["tol"]] * 2, [y - 0.42, y + 0.42], color="black", lw=2.2)
            ax.text(hi * 1.15, y, "not compared", va="center", ha="left", fontsize=8, color="black")
            continue
        bad = t["ratio"] is None or t.get("nonfinite", 0) > 0
        ratio = hi if bad else max(t["ratio"], lo)
        unrep = not t["passed"] and (t.get("unrep", False) or t.get("carried", False))
        colour = NONFINITE if bad else PASS if t["passed"] else UNREP_BAR if unrep else FAIL
        ax.barh(y, ratio - lo, left=lo, height=0.62, color=colour)
        if t.get("tol"):
            ax.plot([t["tol"]] * 2, [y - 0.42, y + 0.42], color="black", lw=2.2)
        text = f"NaN/Inf ({t.get('nonfinite', 0)})" if bad else f"{t['ratio']:.2g}"
        verdict = "pass" if t["passed"] else "carried (dg)" if t.get("carried") else "UNREP" if unrep else "FAIL"
        ax.text(hi * 1.15, y, f"{text}  {verdict}", va="center", ha="left", fontsize=8,
                color="black" if t["passed"] or unrep else FAIL)
    ax.set_xlim(lo, hi)
    ax.set_ylim(len(tensors) - 0.5, -0.5)
    ax.set_yticks(range(len(tensors)), [t["name"] for t in tensors], family="monospace")
    ax.set_xlabel("ratio RMS(ref - x) / (RMS(ref) + 1e-8 scale), log scale")
    ax.grid(axis="x", which="major", color="#dddddd", lw=0.6)
    ax.set_axisbelow(True)
    fig.suptitle(fit_title(fig, Canvas, data["title"], 10), fontsize=10, parse_math=False)
    handles = [Patch(color=PASS, label="pass"), Patch(color=FAIL, label="fail"),
               Line2D([], [], color="black", lw=2.2, label="tolerance")]
    if any(t["ratio"] is None or t.get("nonfinite", 0) > 0 for t in tensors):
        handles.insert(2, Patch(color=NONFINITE, label="NaN/Inf"))
    if any(t["passed"] is False and t.get("carried", False) for t in tensors):
        handles.insert(2, Patch(color=UNREP_BAR, label="carried in from dg (its own sum right)"))
    if any(t["passed"] is False and t.get("unrep", False) for t in tensors):
        handles.insert(2, Patch(color=UNREP_BAR, label="UNREP (16-bit storage, within bf16 mode's tol)"))
    if any(t["passed"] is None for t in tensors):
        handles.append(Patch(color=NOT_COMPARED, label="not compared (NaN/Inf on both sides)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)
    return _save(fig, Canvas, path)


def run_plot_data(result) -> dict:
    """The :func:`plot_run` data of a ``kdadbg.run.RunResult``."""
    tensors = [{"name": t.name, "ratio": t.ratio if math.isfinite(t.ratio) and t.compared else None, "tol": t.tol,
                "passed": None if t.passed is None else bool(t.passed), "nonfinite": t.nonfinite,
                "unrep": bool(t.unrep), "carried": t.carried is not None} for t in result.tensors]
    who = result.impl.get("name", "kernels") if result.impl else "kernels"
    done = sum(t.compared for t in result.tensors)
    extra = "".join(f", {len(x)} {what}" for x, what in ((result.not_compared, "not compared"),
                                                          (result.missing, "not provided")) if x)
    verdict = {"not_compared": "NOT COMPARED"}.get(result.verdict, result.verdict.upper())
    window = f"  ·  chunks {result.window[0]}:{result.window[1]}" if result.window else ""
    title = (f"kdadbg run: {result.dump}  ·  {who} vs float64 reference  ·  {result.precision} ({result.device})"
             f"{window}\n"
             f"{verdict}: {result.elements} elements compared in {done} of {result.applying} tensors{extra}")
    return {"title": title, "tensors": tensors}
