"""Rich rendering of a ``DiffResult``: the tap × chunk grid, per-head breakdown, minimum tolerances,
the first divergence with its origin and amplification, non-finite values and determinism.
Nothing is computed here beyond formatting: the numbers come from ``kdadbg.diff``."""

from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kdadbg_kernels.taps import STAGES

from . import id_ranges
from .tables import missing_word
from ..compare.quantities import QUANTITIES

STYLE = {"OK": "green", "DRIFT": "yellow", "BUG": "bold red", "UNREP": "magenta", "NOT_COMPARED": "dim"}


def short(x: float | None) -> str:
    """A ratio in at most 5 characters: ``3e-7``, ``0``; ``—`` where it is not finite (NaN/Inf on one side:
    the JSON's null; the NaN/Inf count says how many)."""
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if not math.isfinite(x):
        return "—"
    if x == 0:
        return "0"
    m, e = f"{x:.0e}".split("e")
    return f"{m}e{int(e)}"


def num(x) -> str:
    """A value (an element of either side): ``NaN``, ``inf``, ``-inf`` as they are."""
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if math.isnan(x):
        return "NaN"
    return f"{x:.4g}"


def fig(x) -> str:
    """A measured figure (ratio, max |err|, floor): ``—`` where it is undefined or not finite (NaN/Inf on one
    side: the JSON's null), never ``inf`` made up from a NaN."""
    if x is None or not math.isfinite(x):
        return "—"
    return f"{x:.4g}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def render(console: Console, res, max_columns: int | None = None) -> None:
    """Everything ``kdadbg diff`` prints, in reading order."""
    render_header(console, res)
    if res.cells:
        render_grid(console, res, max_columns)
        render_head_quantities(console, res)
        render_heads(console, res)
    render_first(console, res)
    render_nonfinite(console, res)
    render_missing(console, res)
    render_repeat(console, res)
    for note in res.notes:
        console.print(f"note: {escape(note)}", soft_wrap=True, highlight=False)
    n = res.counts()
    console.print(compared_line(n), soft_wrap=True, highlight=False)
    render_tensors(console, res)
    verdict = {"pass": "[green]pass[/green]", "fail": "[bold red]fail[/bold red]",
               "partial": f"[bold yellow]partial[/bold yellow]: nothing failed, but {escape(partial_reason(res))}: "
                          f"not a full pass",
               "not_compared": "[bold yellow]not compared[/bold yellow]: no cell compared any element (every one "
                               "NaN/Inf on both sides); nothing was checked"}[res.verdict]
    console.print(f"verdict: {verdict}", highlight=False, soft_wrap=True)


def render_tensors(console: Console, res) -> None:
    """The outputs and gradients that fail as whole tensors (``run``'s rule over the compared rows; ``diff A B``:
    over every row both files hold, those of ``--chunks``/``--heads`` where asked), where
    no BUG cell says so already: the diff fails with them, and its first divergence leads to them."""
    failing = res.tensors_failing
    if not failing:
        return
    t = res.tensors
    what = "; ".join(f"{n} ratio {fig(t[n]['ratio'])} > tol {t[n]['tol']:g}"
                     f"{' (returned in ' + t[n]['storage'] + ': bf16 mode' + chr(39) + 's tol)' if t[n]['storage'] else ''}"
                     f" over {t[n]['elements']} elements" for n in failing)
    drift = "" if res.first_bug is not None else \
        "; no cell of theirs is a BUG (those over tolerance, if any, are DRIFT or UNREP), which alone would not fail"
    rows = "every row both files hold" if res.mode == "files" else "the compared rows"
    console.print(f"[bold red]over tolerance as whole tensors[/bold red] (as `kdadbg run` judges them, over "
                  f"{rows}): {what}{drift}", soft_wrap=True, highlight=False)
    if res.first_bug is not None:
        return   # the first BUG above leads there: a line per tensor read as ten places to start (a user trial)
    for n in failing:
        lead = res.tensor_lead(n)
        if lead is None or (res.first_divergence is not None and lead["tap"] == res.first_divergence["tap"]):
            continue   # (where the first divergence is in this tensor, the lines above lead to it already)
        floor = f", noise floor {fig(lead['floor'])}" if lead["floor"] is not None else ""
        which = "first cell over its tolerance" if lead["lead"] == "first" else \
            "cell furthest over its noise floor (every cell over its tolerance is UNREP)"
        where = "every chunk (a sum over them)" if lead["chunk"] is None else f"chunk {lead['chunk']}"
        console.print(f"  {n}: {which}: {where}, {_head(lead)}: ratio "
                      f"{fig(lead['ratio'])} > tol {lead['tol']:g} ({lead['label']}{floor}); start looking there",
                      soft_wrap=True, highlight=False)


def partial_reason(res) -> str:
    """What keeps a diff from a full pass: ``dq, dk not provided; o not compared (...)``."""
    parts = []
    if res.missing_outputs:
        parts.append(f"{', '.join(res.missing_outputs)} "
                     f"{missing_word(res.not_provided.get(n, '') for n in res.missing_outputs)}")
    if res.outputs_not_compared:
        parts.append(f"{', '.join(res.outputs_not_compared)} not compared (NaN/Inf on both sides in every row)")
    if res.taps_not_provided:
        parts.append(f"the taps asked for {', '.join(res.taps_not_provided)} not provided")
    return "; ".join(parts)


def compared_line(n: dict) -> str:
    """``compared N cells (T tap, R output/gradient row; E elements): ...``, with the cells not compared."""
    labels = ", ".join(f"{n[k.lower()]} {k}" + (f" ({n['carried']} of them dA_log/ddt_bias carried in from dg, "
                                                 f"which --strict does not fail)" if k == "DRIFT" and n.get("carried")
                                                 else "")
                       for k in ("OK", "DRIFT", "BUG", "UNREP") if n[k.lower()])
    nc = n.get("not_compared", 0)
    extra = f"; {plural(nc, 'cell')} not compared (every element NaN/Inf on both sides, the structural zeros of a triangular tap aside)" if nc else ""
    return (f"compared {plural(n['cells'], 'cell')} ({n['tap_cells']} tap, {n['row_cells']} output/gradient row; "
            f"{n['elements']} elements): {labels or 'none'}{extra}")


def render_header(console: Console, res) -> None:
    if res.mode == "files":
        # in the command line's order, A the reference (was "B vs A", the reverse of `diff A B`)
        what = (f"{escape(str(res.files.get('reference')))} {escape(str(res.files.get('theirs')))} "
                f"(A, the reference; B, judged against it)")
    else:
        what = f"--impl {escape(res.sources[0])} ({escape(res.impl.get('kind', ''))}) vs the float64 reference"
    chunks = f"chunks {res.chunks[0]}:{res.chunks[-1] + 1}" if res.chunks else "no chunks"
    extra = ""
    if res.files and any(c.quantity.is_tap for c in res.cells.values()):   # (no taps compared: nothing to say)
        layout, units = res.files["state_layout"], res.files["gate_units"]
        conv = [*(["S/dS from [V,K]"] if layout == "vk" else []), *(["gates from log2"] if units == "log2" else [])]
        extra = (f", theirs converted: {', '.join(conv)}" if conv else
                 ", theirs' taps as written (S/dS taps [K,V], gates ln, as --taps-state-layout and "
                 "--taps-gate-units say: nothing converted)")
    qk = next((c for c in res.cells.values() if c.group > 1), None)
    if qk is not None:   # GVA
        hs = qk.heads
        which = f"q/k head {hs[0]}, which they read" if len(hs) == 1 else \
            f"q/k heads {','.join(map(str, hs))}, which they read"
        extra = f" (value heads; dq, dk on {which}){extra}"
    src = f"{escape(res.dump)}: " if res.dump else ""
    console.print(f"[bold]kdadbg diff[/bold] {src}{what}; precision {res.precision}"
                  f"{', device ' + res.device if res.device else ''}; {chunks}, heads "
                  f"{id_ranges(res.heads, ',')}{extra}", soft_wrap=True, highlight=False)


def render_grid(console: Console, res, max_columns: int | None = None) -> None:
    if max_columns is None:
        max_columns = max(4, (console.width - 32) // 6)
    grid = res.grid(max_columns)
    # (the metric's name, not the implementation's: "fla ratio" read as fla's own figures under --impl fla)
    title = "ratio RMS(ref-x)/RMS(ref) per tap × chunk, worst head" + (
        f" (columns: {grid['bucket']} chunks each, worst cell)" if grid["bucket"] > 1 else "")
    # the title on a line of its own: as the table's, rich wrapped it to a narrow grid's width (a user trial)
    console.print(Text(title, style="italic"), soft_wrap=True)
    t = Table(padding=(0, 0), show_edge=False, pad_edge=False)
    t.add_column("tap", no_wrap=True, style="bold")
    for lo, hi in grid["columns"]:
        t.add_column(f" {lo}" if lo == hi else f" {lo}-{hi}", justify="right", no_wrap=True)
    t.add_column("  tol", justify="right", no_wrap=True)
    t.add_column(" min tol", justify="right", no_wrap=True)
    mins = res.min_tolerance()
    plain = console.color_system is None   # no colours (a pipe, a log, NO_COLOR): the labels as marks
    stage = None
    for row in grid["rows"]:
        if row["stage"] != stage:
            if stage is not None:
                t.add_section()
            stage = row["stage"]
        cells = [Text(" ·") if c is None else
                 Text(" " + ("unrep" if c["label"] == "UNREP" else "—" if c["label"] == "NOT_COMPARED"
                             else short(c["ratio"]) + (PLAIN_MARK.get(c["label"], "") if plain else "")
                             + ("°" if _absolute(c, mins[row["tap"]]["tol"]) else "")),
                      style=STYLE[c["label"]])
                 for c in row["cells"]]
        m = mins[row["tap"]]
        worst = "BUG" if m["bug"] else ("DRIFT" if m["drift"] else "OK")
        name = row["tap"] if row["kind"] == "tap" else f"[italic]{row['tap']}[/italic]"
        t.add_row(name, *cells, "  " + short(m["tol"]),
                  Text(" —", style=STYLE["NOT_COMPARED"]) if m["min_tol"] is None else
                  Text(" —", style=STYLE[worst]) if not math.isfinite(m["min_tol"]) else
                  Text(" " + f"{m['min_tol']:.2g}", style=STYLE[worst]))
    console.print(t)
    console.print(grid_legend(grid, plain, files_labels(res)), soft_wrap=True, highlight=False)


def files_labels(res) -> tuple[str | None, str] | None:
    """What DRIFT (None: none can be) and BUG mean in ``diff A B`` (no dump, no noise floor), for the grid's
    legend; None elsewhere."""
    if res.mode != "files":
        return None
    if res.files.get("tol_sum"):
        return "over it, within the sum of both files' tolerances (A is not the float64 reference)", "beyond"
    return None, "over it (no dump: no noise floor)"


# a cell's label where no colour shows it (a pipe, a log): BUG and DRIFT read as OK there (a user trial)
PLAIN_MARK = {"BUG": "!", "DRIFT": "~"}


def _absolute(cell: dict, tol: float) -> bool:
    """An OK cell over its tolerance: it passed by the absolute rule (its max abs error within 1e-6 of the
    quantity's scale), which a figure over the tol column alone left unexplained (a user trial)."""
    r = cell["ratio"]
    return cell["label"] == "OK" and r is not None and math.isfinite(r) and r > tol


def grid_legend(grid: dict, plain: bool = False, labels: tuple[str | None, str] | None = None) -> str:
    """The grid's legend, for the symbols it shows: a ~600-character paragraph under every diff said all of
    them every time (a user trial). ``plain``: no colours or italics show, the labels are marks.
    ``labels``: what DRIFT (None: none can be) and BUG mean where not the noise floor's rule (``diff A B``)."""
    seen = {"·" if c is None else c["label"] for row in grid["rows"] for c in row["cells"]}
    absolute = any(c is not None and _absolute(c, row["tol"]) for row in grid["rows"] for c in row["cells"])
    finite = any(c is not None and c["label"] not in ("UNREP", "NOT_COMPARED") and c["ratio"] is not None
                 and not math.isfinite(c["ratio"]) for row in grid["rows"] for c in row["cells"])
    parts = ["rows in dataflow order (" + ("outputs and gradients among the taps" if plain else
                                           "[italic]italic[/italic]: outputs and gradients")
             + ", ht at a sequence's last chunk, dh0 at its first)",
             "a bare figure OK: within tolerance" if plain else "[green]OK[/green] within tolerance"]
    drift, bug = labels or ("over it, within ten times the noise floor", "beyond")
    if labels is not None and drift is None and "BUG" in seen:
        parts.append(f"! BUG: {bug}" if plain else f"[bold red]BUG[/bold red] {bug}")
    elif ("DRIFT" in seen or "BUG" in seen) and plain:
        parts.append(f"~ DRIFT: {drift}; ! BUG: {bug}")
    elif "DRIFT" in seen or "BUG" in seen:
        parts.append(f"[yellow]DRIFT[/yellow] {drift}; [bold red]BUG[/bold red] {bug}")
    if absolute:
        parts.append("° OK over the tolerance: its max abs error within the absolute floor (1e-6 of the quantity's "
                     "scale), a pass at any tolerance")
    if "UNREP" in seen:
        parts.append("[magenta]unrep[/magenta] over it where the compared precision cannot hold the value (not a "
                     "divergence)")
    if "·" in seen:
        parts.append("· not provided or not selected")
    if "NOT_COMPARED" in seen:
        parts.append("— every element NaN/Inf on both sides")
    if finite:
        parts.append("a label's colour with no figure: NaN/Inf on one side")
    parts.append("min tol: the tolerance every compared cell but UNREP ones would pass")
    return "; ".join(parts)


def render_head_quantities(console: Console, res) -> None:
    cells = res.per_head_quantities()
    if not cells:
        return
    # the label in words where it is not OK: UNREP or BUG showed only as a colour (a user trial)
    parts = [Text.assemble(f"{c['tap']} head {c['head']} ", ("—" if c["label"] == "NOT_COMPARED" else
                                                              short(c["ratio"]), STYLE[c["label"]]),
                           "" if c["label"] in ("OK", "NOT_COMPARED") else f" {c['label']}", _unrep_why(c))
             for c in cells]
    console.print(Text("per-head gradients (every chunk): ").append(Text(", ").join(parts)), soft_wrap=True)


def _unrep_why(c: dict) -> str:
    """Why a per-head cell is UNREP, briefly: `` (noise floor 0.191 > tol 0.01)``, else its reason ('' if none)."""
    if c["label"] != "UNREP":
        return ""
    floor = c.get("floor")
    if floor is not None and math.isfinite(floor) and floor > c["tol"]:
        return f" (noise floor {fig(floor)} > tol {short(c['tol'])})"
    return f" ({c['reason']})" if c.get("reason") else ""


def render_heads(console: Console, res) -> None:
    gva = any(c.group > 1 for c in res.cells.values())
    # under GVA a dq/dk cell is per q/k head: each value head that reads it counts it (the totals count it once)
    t = Table(title="per value head" + (" (a dq/dk cell is a q/k head's: counted under each value head that "
                                        "reads it)" if gva else ""), title_justify="left")
    t.add_column("head", justify="right")
    stages = [s for s in STAGES if any(c.stage == s for c in res.cells.values())]
    for s in stages:
        t.add_column(f"worst {s}", justify="right")
    t.add_column("failing cells", justify="right")
    t.add_column("first over tol")
    for row in res.per_head():
        first = row["first"]
        t.add_row(str(row["head"]), *(short(row["worst"].get(s)) for s in stages), str(row["failing"]),
                  "-" if first is None else f"{first['tap']} " + ("every chunk" if first["chunk"] is None
                                                                  else f"chunk {first['chunk']}"),
                  style="red" if row["failing"] else None)
    console.print(t)


def _where(d: dict) -> str:
    if d.get("chunk") is None:
        return f"{d['tap']}{list(d['index'])}" if d.get("index") else d["tap"]
    parts = [f"seq {d['seq']}", f"chunk {d['chunk_in_seq']} of it"]
    if d.get("row") is not None:
        parts.append(f"row {d['row']} (token {d['token']})")
    for axis in ("k", "v"):
        if axis in d:
            parts.append(f"{axis} {d[axis]}")
    if d.get("axes") == ["C", "C"]:
        parts.append(f"col {d['index'][1]}")
    return ", ".join(parts)


def _over(d: dict) -> str:
    """``ratio 0.01 > tol 1e-5``, or where NaN/Inf on one side leave no finite ratio, how many."""
    r = d["ratio"]
    if r is None or not math.isfinite(r):
        return f"{plural(d['nonfinite'], 'element')} NaN/Inf on one side (no finite ratio; tol {short(d['tol'])})"
    return f"ratio {fig(r)} > tol {short(d['tol'])}"


def _head(d: dict) -> str:
    """``head 3``, or for dq/dk under GVA ``q/k head 1 (value heads 2-3)``."""
    vh = d.get("value_heads")
    return f"q/k head {d['head']} (value heads {vh[0]}-{vh[-1]})" if vh else f"head {d['head']}"


def no_divergence(n: dict, markup: bool = True) -> str:
    """What "no divergence" means for these counts: UNREP cells are over their tolerance (the compared
    precision cannot judge them, never a failure) and cells with nothing compared were not judged at all."""
    if n["cells"] == 0:
        head = "[yellow]no divergence found[/yellow]" if markup else "no divergence found"
        return f"{head}: no cell compared any element ({plural(n.get('not_compared', 0), 'cell')} not compared)"
    head = "[green]no divergence[/green]" if markup else "no divergence"
    within = "every compared cell within its tolerance"
    if n["unrep"]:
        within += f" or UNREP ({plural(n['unrep'], 'cell')} over it that the precision cannot judge)"
    nc = n.get("not_compared", 0)
    extra = f"; {plural(nc, 'cell')} not compared" if nc else ""
    return f"{head}: {within} ({plural(n['cells'], 'cell')}, {plural(n['elements'], 'element')}{extra})"


def render_first(console: Console, res) -> None:
    first = res.first_divergence
    kname, rname = (escape(res.sources[0]), "reference") if res.mode != "files" else ("B", "A")
    if first is None:
        console.print(no_divergence(res.counts()), highlight=False, soft_wrap=True)
        return
    style = STYLE[first["label"]]
    where = "every chunk" if first["chunk"] is None else f"chunk {first['chunk']}"
    carried = (f", carried in from dg: its exact sum is {fig(first['carried_in_from_dg']['ratio'])} off"
               if "carried_in_from_dg" in first else "")
    if "sum_not_checkable" in first:   # compare.carried.unchecked_in: the split, the note says the rest
        u = first["sum_not_checkable"]
        carried = (f", its sum not checkable: the exact sum of the returned dg at ratio {fig(u['carried'])} from the "
                   f"reference, its value at {fig(u['own'])} from that sum, within the reach of dg's rounding, "
                   f"{fig(u['reach'])}")
    console.print(f"[bold]first divergence[/bold]: [{style}]{first['tap']}[/{style}] ({first['stage']}) {where}"
                  f", {_head(first)}: {_over(first)}"
                  f" ([{style}]{first['label']}[/{style}]"
                  f"{carried}"
                  f"{': ' + escape(first['reason']) if first['label'] == 'DRIFT' and first.get('reason') else ''}"
                  f"{', noise floor ' + fig(first['floor']) if first['floor'] is not None else ''})",
                  soft_wrap=True, highlight=False)
    _worst(console, first, kname, rname)
    _origin(console, res.origin_first)   # where the first divergence is a DRIFT before the first BUG
    bug = res.first_bug
    if bug is not None and (bug["tap"], bug["chunk"], bug["head"]) != (first["tap"], first["chunk"], first["head"]):
        # the rerun and the amplification below are the first BUG's (DiffResult.focus)
        where = "every chunk" if bug["chunk"] is None else f"chunk {bug['chunk']}"
        console.print(f"[bold]first BUG[/bold]: [bold red]{bug['tap']}[/bold red] ({bug['stage']}) {where}, "
                      f"{_head(bug)}: {_over(bug)} (BUG, noise floor {fig(bug['floor'])})", soft_wrap=True,
                      highlight=False)
        _worst(console, bug, kname, rname)
    _origin(console, res.origin)
    _amplification(console, res)


FWD_TAPS = tuple(n for n in QUANTITIES if QUANTITIES[n].stage.startswith("fwd"))
AMPLIFICATION_STEPS = 12   # chunks an amplification line shows before it elides the middle


def _amplification(console: Console, res) -> None:
    """The error's growth chunk by chunk along the diverging sequence (``localise.amplification``)."""
    for a in res.amplification:
        steps = []
        labels = a.get("labels") or [None] * len(a["chunks"])
        for i, (c, r, lab) in enumerate(zip(a["chunks"], a["ratios"], labels)):
            g = a["growth"][i - 1] if i else None
            if lab == "UNREP":   # (it read "—", as a cell not compared does: a user trial)
                steps.append(f"chunk {c} unrep")
            else:
                steps.append(f"chunk {c} {short(r)}" + (f" (×{g:.3g})" if g is not None else ""))
        if len(steps) > AMPLIFICATION_STEPS:   # a long sequence: its first and last chunks, the rest in --json
            head, tail = AMPLIFICATION_STEPS // 2, AMPLIFICATION_STEPS // 2 - 1
            steps = [*steps[:head], f"… {len(steps) - head - tail} chunks (every one in --json) …", *steps[-tail:]]
        if steps:   # (it read "1:5e-3 → 0:8e-7 (×0.000162)": a user trial)
            console.print(f"  amplification of {a['tap']} ({_head(a)}), its ratio chunk by chunk in the {a['direction']} "
                          f"pass's order, ×: the change from the chunk before (unrep: a value the compared precision "
                          f"cannot hold): " + " → ".join(steps), soft_wrap=True, highlight=False)


def _origin(console: Console, o: dict | None) -> None:
    """The window rerun's verdict on the cell above it: introduced here, inherited, or why it did not run."""
    if o is not None and "window" not in o:
        console.print(f"  origin: {escape(o.get('reason', 'unknown'))}", soft_wrap=True, highlight=False)
    elif o is not None:
        lo, hi = o["window"]
        how = (f"window chunks {lo}..{hi} of seq {o['seq']}, seeded with {o['seeded']['h0']} and "
               f"{o['seeded']['dht']}")
        if o["verdict"] == "introduced":
            floor = f", {o['label']}, noise floor {fig(o['floor'])}" if o.get("floor") is not None else ""
            c = o["chunk"]
            # the chunks of the window that reach c: the earlier ones through S (forward), the later through
            # dS (backward); the window starts at the chunk producing the cell, so a forward cell has none
            # (a user trial: "6-7, whose S reaches it" of a forward cell at chunk 5)
            # (the window starts one chunk early where no S was compared: that chunk's state update reaches c)
            fwd = o["tap"] in FWD_TAPS
            before, after = list(range(lo, c)), ([] if fwd else list(range(c + 1, hi + 1)))
            # a DRIFT (within 10x the noise floor: precision, not a fault) arises; a BUG's is a fault
            what, style = ("the drift arises", "bold yellow") if o.get("label") == "DRIFT" else \
                ("the fault is", "bold red")
            early = lo == c - 1 and o["tap"] != "S"   # started early: no S compared (localise.window_rerun)
            others = [*([f"in chunk {lo}'s state update, which wrote the S entering it (no S tap was compared, so "
                         f"the window starts there)" if early else f"in {id_ranges(before)}, whose S reaches it"]
                        if before else []),
                      *([f"in {id_ranges(after)}, whose dS reaches it"] if after else [])]
            if not others:
                where = f"{what} in chunk {c} itself"
            else:
                where = (f"{what} in chunk {c} itself, or {', or '.join(others)}"
                         + ("" if early else f" (--window 1 reruns chunk {c} alone)"))
            console.print(f"  [{style}]introduced in the window[/{style}]: rerun on {how}: {o['tap']} at chunk "
                          f"{c} still diverges (ratio {fig(o['ratio'])}{floor}): {where}", soft_wrap=True,
                          highlight=False)
        elif o["verdict"] == "inherited":
            within = ("within what the compared precision holds (UNREP: ratio " + fig(o['ratio']) + ", noise floor "
                      + fig(o.get('floor')) + ")") if o.get("label") == "UNREP" else \
                f"within tolerance (ratio {fig(o['ratio'])})"
            seed = o.get("carried_by", False)
            positions = ("the error is tied to where the chunk sits (its absolute token positions, its batch row "
                         "or sequence, its place in its sequence, tokens read across a sequence boundary), which "
                         "the window's rerun, one sequence of its own starting afresh, does not reproduce")
            if o.get("seq_start"):
                why = (f"; chunk {lo} starts its sequence, so nothing is carried in from within it: the error comes "
                       f"from outside the sequence (a state not reset at the boundary, a wrong offset or "
                       f"initial-state load) or is tied to absolute token positions, which the window's rerun "
                       f"starts afresh")
            elif seed is None:   # a forward-prepare tap: it reads its own chunk's tokens only
                why = (f"; {o['tap']} reads only its chunk's own tokens, so nothing is carried into it: " + positions
                       + " (or the implementation reads tokens outside the chunk)")
            elif seed and seed["label"] in ("OK", "UNREP"):
                why = (f"; in the whole run the state{'s' if o['tap'] not in FWD_TAPS else ''} seeding the window "
                       f"{'are' if o['tap'] not in FWD_TAPS else 'is'} within tolerance (the worst: {seed['tap']} at "
                       f"chunk {seed['chunk']}, head {seed['head']}, ratio {fig(seed['ratio'])}): no error over it "
                       f"was carried in, so either " + positions + ", or an error carried in below tolerance grew "
                       f"past it here")
            elif seed:
                why = (f"; the error was carried in: in the whole run {seed['tap']} at chunk {seed['chunk']}, head "
                       f"{seed['head']}, which seeds the window, is {seed['label']} (ratio {fig(seed['ratio'])})")
            else:   # no state taps to measure what was carried in
                why = ("; the error was carried in, or is tied to where the chunk sits (its absolute token positions, "
                       "its batch row or sequence), which the window's rerun, one sequence of its own (B = 1) "
                       "starting afresh, does not reproduce; taps of S and dS would tell the two apart")
            # the headline says what the rerun showed: "inherited" only where a seed measured failing carried the
            # error in (or, without state taps, could have); otherwise the rerun did not reproduce it (a user
            # trial: a fault tied to a sequence's place in the batch read "inherited")
            carried = seed is False or (seed and seed["label"] not in ("OK", "UNREP"))
            head = "[yellow]inherited[/yellow]" if carried and not o.get("seq_start") else \
                "[yellow]not reproduced on the window[/yellow]"
            console.print(f"  {head}: rerun on {how}: {o['tap']} at chunk {o['chunk']} is {within}"
                          f"{why}", soft_wrap=True, highlight=False)
            w = o.get("first_in_window")
            if w is not None and w["label"] == "BUG" and w["chunk"] is not None \
                    and (w["tap"], w["chunk"]) != (o["tap"], o["chunk"]):   # a fault that moved: a BUG in a chunk
                at = (f"  the window's rerun itself has its first BUG at {w['tap']} chunk {w['chunk']}, {_head(w)} "
                      f"(ratio {fig(w['ratio'])}"
                      + (f", token {w['token']}" if w.get("token") is not None else "") + ")")
                if w["chunk"] == lo + 1 and w["tap"] != "S" and QUANTITIES[w["tap"]].stage != "fwd_prepare":
                    # one chunk after the seeded one: the first chunk reading a state the implementation wrote
                    # itself (a user trial: a wrong state update read as tied to token positions)
                    console.print(at + f": chunk {lo + 1} is the window's first to read a state the implementation "
                                  f"wrote itself (chunk {lo}'s state update; the window seeded chunk {lo}'s own): a "
                                  f"wrong state update, carried through S, diverges one chunk after wherever the "
                                  f"run starts", soft_wrap=True, highlight=False)
                else:   # the rerun diverged elsewhere: a fault that moved with the window's start is tied to positions
                    console.print(at + ": a fault that moves with where the run starts is tied to token positions, "
                                  "not carried in", soft_wrap=True, highlight=False)
        else:
            console.print(f"  origin: {escape(o.get('reason', 'unknown'))}", soft_wrap=True, highlight=False)


def _worst(console: Console, cell: dict, kname: str, rname: str) -> None:
    index = cell.get("index")
    what = f"worst element {index}" if index not in (None, [], ()) else "its value"   # (a scalar cell: dA_log's)
    if cell.get("weighted_by") and not cell["nonfinite"]:   # the exp(-gc) taps: judged as exp(gc) x the tap
        diff = f"|diff| {fig(abs(cell['kernel'] - cell['reference']))} ({fig(cell['max_abs'])} times exp(gc), " \
               f"the scale the cell is judged at)"
    else:
        diff = f"|diff| {fig(cell['max_abs'])}"
    console.print(f"  {what}: {_where(cell)}: {kname} {num(cell['kernel'])}, "
                  f"{rname} {num(cell['reference'])}, {diff}"
                  f"{', ' + str(cell['nonfinite']) + ' NaN/Inf' if cell['nonfinite'] else ''}",
                  soft_wrap=True, highlight=False)


EXPONENT_ROWS = 12   # rows of the exp-arguments table at most (the JSON's exponents has every chunk)


def render_nonfinite(console: Console, res) -> None:
    """The first NaN/Inf cell and, to explain it, the exp arguments of the chunks that overflow float32 and of
    its own chunk. Nothing where no cell holds a NaN/Inf: an overflowing exponent the implementation handled
    explains nothing (a user trial: 16 rows on every diff of a strong-gate dump)."""
    nf = res.first_nonfinite
    if nf is None:
        return
    console.print(f"[bold magenta]first NaN/Inf[/bold magenta]: {nf['tap']} chunk {nf['chunk']}, "
                  f"{_head(nf)}, element {nf['index']} ({_where(nf)}): {num(nf['kernel'])}, "
                  f"reference {num(nf['reference'])}",
                  soft_wrap=True, highlight=False)
    rows = [e for e in res.exponents if e["overflow_fp32"] or e["chunk"] == nf["chunk"]]
    if not rows:
        return
    flagged = sum(e["overflow_fp32"] for e in res.exponents)
    console.print(f"exp arguments (reference; above 88.7 overflows fp32): {plural(flagged, 'chunk')} of "
                  f"{len(res.exponents)} over it" + (f", and the first NaN/Inf's chunk {nf['chunk']}"
                                                    if not any(e["chunk"] == nf["chunk"] and e["overflow_fp32"]
                                                               for e in res.exponents) else ""),
                  soft_wrap=True, highlight=False)   # (a line of its own: a table's title wraps to its width)
    t = Table()
    for col in ("chunk", "seq", "gc", "gT - gc", "-gc", "max"):
        t.add_column(col, justify="right")
    for e in rows[:EXPONENT_ROWS]:
        t.add_row(str(e["chunk"]), str(e["seq"]), *(f"{e[k][0]:.3g}..{e[k][1]:.3g}" for k in
                                                     ("gc", "gT_minus_gc", "neg_gc")),
                  f"{e['max_exponent']:.3g}", style="red" if e["overflow_fp32"] else None)
    console.print(t)
    if len(rows) > EXPONENT_ROWS:
        console.print(f"  ... {len(rows) - EXPONENT_ROWS} more (every chunk's: `exponents` in --json)",
                      highlight=False)


def render_missing(console: Console, res) -> None:
    m = res.missing or {}
    labels = {"taps": "taps it does not provide", "chunks": "chunks missing from its taps",
              "heads": "heads missing from its taps", "not_written": "taps all NaN where the reference is finite (not written, or NaN written; compared)",
              "not_in_reference_file": "taps missing from the reference file"}
    for key, label in labels.items():
        if m.get(key):
            console.print(f"[yellow]{label}[/yellow]: {', '.join(str(x) for x in m[key])}", soft_wrap=True,
                          highlight=False)
    if res.not_provided:
        why = {}
        for n, w in res.not_provided.items():
            why.setdefault(w, []).append(n)
        for w, names in why.items():
            console.print(f"[yellow]{missing_word([w])}[/yellow] ({escape(w.removeprefix('not compared: '))}): "
                          f"{', '.join(names)}", soft_wrap=True, highlight=False)


def render_repeat(console: Console, res) -> None:
    r = res.repeat
    if r is None:
        return
    if r["identical"]:
        console.print(f"determinism: all {r['runs']} runs were bit-identical", highlight=False)
    elif r.get("tap"):
        console.print(f"[bold red]nondeterministic[/bold red]: run {r['run']} differs from run 1 first at "
                      f"{r['tap']} chunk {r['chunk']}, head {r['head']} ({r['elements']} elements)", highlight=False)
    else:
        at = "".join(f", {k} {r[k]}" for k in ("chunk", "head", "token") if r.get(k) is not None)
        taps = "every tap identical" if r.get("taps_compared") else "no taps to compare"
        n = f"{r['elements']} element{'s' if r['elements'] > 1 else ''}"
        console.print(f"[bold red]nondeterministic[/bold red]: run {r['run']} differs from run 1 first at "
                      f"{r['output']}{at} ({n}; {taps})", highlight=False)


def render_plot(console: Console, info: dict) -> None:
    console.print(f"wrote {escape(info['path'])}: taps {info['rows'][0]}..{info['rows'][-1]} x chunks "
                  f"{info['chunks'][0]}..{info['chunks'][1]}", soft_wrap=True, highlight=False)
