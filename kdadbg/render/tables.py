"""Rich rendering of the plain data the library returns. No computation happens here."""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


def _num(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def _fig(x) -> str:
    """A measured figure (max |err|, ratio, cosine): ``—`` where it is undefined or not finite (NaN/Inf on
    one side; the JSON's null), never ``inf`` made up from a NaN."""
    return "—" if x is None or not math.isfinite(x) else f"{x:.4g}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _count(n) -> str:
    return "-" if n is None else str(n)


def _shape(shape) -> str:
    return "[" + ",".join(str(s) for s in shape) + "]"


def print_json(console: Console, data) -> None:
    console.out(json.dumps(data, indent=2, default=str), highlight=False)


def missing_word(reasons) -> str:
    """How to name outputs missing for these reasons: "not compared" where each was returned but cannot be
    judged (no upstream gradient: ``dump.NO_UPSTREAM``), else "not provided"."""
    reasons = list(reasons)
    return "not compared" if reasons and all(str(w).startswith("not compared") for w in reasons) else "not provided"


def print_error(console: Console, message: str) -> None:
    """One red line: ``error: <message>``."""
    console.print(f"[bold red]error:[/bold red] {escape(message)}", soft_wrap=True, highlight=False)


def print_note(console: Console, message: str) -> None:
    """One line on stderr: ``note: <message>``."""
    console.print(f"[yellow]note:[/yellow] {escape(message)}", soft_wrap=True, highlight=False)


def _tensor_table(desc: dict, roles: bool) -> Table:
    t = Table(title="tensors", title_justify="left")
    cols = ("name", *(("role",) if roles else ()), "shape", "dtype", "min", "max", "mean", "NaN", "Inf")
    for col in cols:
        t.add_column(col, justify="right" if col in ("min", "max", "mean", "NaN", "Inf") else "left", no_wrap=True)
    for r in desc["tensors"]:
        name = r["name"] if roles or r["role"] == "input" else f"{r['name']} (extra)"
        bad = "red" if r["nan"] or r["inf"] else None
        t.add_row(name, *((r["role"],) if roles else ()), _shape(r["shape"]), r["dtype"], _num(r["min"]),
                  _num(r["max"]), _num(r["mean"]), _count(r["nan"]), _count(r["inf"]), style=bad)
    return t


WRITTEN_BY = {"capture": "written by `kdadbg capture` beside its dump (the implementation's own outputs and "
                         "gradients in training)",
              "taps": "made by `kdadbg taps` (or another writer of the layout)",
              "run --save": "made by `kdadbg run --save` (an implementation's outputs and gradients)"}


def _render_taps_file(console: Console, desc: dict) -> None:
    """``inspect`` on a taps file (``desc["kind"] == "taps file"``): what it is, what it holds, how to use it."""
    f = desc["taps_file"]
    fmt = f["format"] or "outputs and gradients alone, no format key"
    console.print(escape(f"a taps file ({fmt}), not a dump: {WRITTEN_BY[f['written_by']]}"), soft_wrap=True,
                  highlight=False)
    made = [f"source {f['source'] or 'not recorded'}", f"precision {f['precision'] or 'not recorded'}"]
    if f["dump"]:
        made.append(f"from dump {f['dump']}" + (f" (inputs_sha256 {f['inputs_sha256'][:12]}…)"
                                                 if f["inputs_sha256"] else " (no inputs digest)"))
    console.print(escape(", ".join(made)), soft_wrap=True, highlight=False)
    _render_origin(console, desc.get("origin"))
    if desc["config"]:
        console.print(escape("config: " + " ".join(f"{r['key']}={r['value']}" for r in desc["config"])),
                      soft_wrap=True, highlight=False)
    if desc["ok"]:
        if f["outputs"]:
            console.print(escape(f"outputs and gradients (whole tensors): {', '.join(f['outputs'])}"), soft_wrap=True,
                          highlight=False)
        if f["taps"]:
            from . import id_ranges

            console.print(escape(f"taps: {', '.join(f['taps'])} of chunks {id_ranges(f['chunks']) or 'none'}, heads "
                                 f"{id_ranges(f['heads']) or 'none'} ({len(f['missing_taps'])} registry taps not "
                                 f"held)"), soft_wrap=True, highlight=False)
        else:
            console.print("taps: none", highlight=False)
    if desc["tensors"]:
        console.print(_tensor_table(desc, roles=True))
    if desc["extra"]:
        console.print("outside the taps file layout, not read: " + ", ".join(desc["extra"]), soft_wrap=True,
                      highlight=False)
    for w in desc.get("warnings", []):
        console.print(escape(f"warning: {w}"), style="yellow", soft_wrap=True, highlight=False)
    _render_nonfinite(console, desc.get("nonfinite") or [], "NaN/Inf in the file:")
    verdict = "[green]valid taps file[/green]" if desc["ok"] else f"[red]invalid:[/red] {escape(desc['verdict'])}"
    console.print(f"verdict: {verdict}", soft_wrap=True, highlight=False)
    if desc["ok"]:
        console.print(escape(f"use it: {f['use']}") + ("  (DUMP: the dump it was made from)" if " DUMP " in f["use"]
                                                        else ""), soft_wrap=True, highlight=False)


def _render_origin(console: Console, origin: dict | None) -> None:
    if not origin:
        return
    where = [f"{key} {origin[key]}" for key in ("step", "call", "module", "rank")
             if origin.get(key) is not None and origin.get(key) != ""]
    extra = f" by {origin['impl']}" if origin.get("impl") else ""
    why = f" ({origin['reason']})" if origin.get("reason") else ""
    if origin.get("nonfinite"):
        why += f", NaN/Inf in {', '.join(origin['nonfinite'])}"
    if origin.get("inside"):   # a call made inside another captured call (a wrapper's): as --json says
        why += f", inside {origin['inside']}"
    console.print(escape(f"captured{extra}: {', '.join(where) or 'origin unknown'}{why}"), soft_wrap=True,
                  highlight=False)


def _render_nonfinite(console: Console, bad: list[dict], title: str) -> None:
    if not bad:
        return
    console.print(escape(title), style="yellow", soft_wrap=True, highlight=False)
    for r in bad:
        counts = ", ".join(f"{n} {w}" for n, w in ((r["nan"], "NaN"), (r["inf"], "Inf")) if n)
        at = ", ".join(f"{k} {r[k]}" for k in ("batch", "sequence", "token", "head", "chunk")
                       if r.get(k) is not None and not (k == "sequence" and r.get("batch") == r[k]))
        line = f"  {r['name']}: {counts}; first at {_shape(r['first'])}" + (f" ({at})" if at else "")
        console.print(escape(line), soft_wrap=True, highlight=False)


def render_inspect(console: Console, desc: dict) -> None:
    console.print(f"[bold]{escape(desc['path'])}[/bold]", soft_wrap=True)
    if desc.get("kind") == "taps file":
        _render_taps_file(console, desc)
        return
    _render_origin(console, desc.get("origin"))
    if desc["config"] is not None:
        t = Table(title="config", title_justify="left")
        t.add_column("key")
        t.add_column("value")
        t.add_column("source")
        gate = next((row["value"] for row in desc["config"] if row["key"] == "gate"), None)
        for row in desc["config"]:
            source = "default" if row["default"] else "file"
            if row["key"] == "lower_bound" and gate != "lower_bound":   # (a user trial: read as in use)
                source += f" (unused: gate {gate})"
            t.add_row(row["key"], str(row["value"]), source)
        console.print(t)
    elif desc["metadata"]:
        console.print("metadata (not a valid config): " + escape(json.dumps(desc["metadata"])), soft_wrap=True)
    if desc["sizes"]:
        console.print("sizes: " + "  ".join(f"{k}={v}" for k, v in desc["sizes"].items()), highlight=False)
    if desc["tensors"]:
        console.print(_tensor_table(desc, roles=False))
    if desc["extra"]:
        console.print("ignored extra tensors: " + ", ".join(desc["extra"]), soft_wrap=True, highlight=False)
    if desc.get("unknown_metadata"):
        console.print(escape("metadata keys not read: " + ", ".join(desc["unknown_metadata"])), soft_wrap=True,
                      highlight=False)
    for w in desc.get("warnings", []):
        console.print(escape(f"warning: {w}"), style="yellow", soft_wrap=True, highlight=False)
    bad = desc.get("nonfinite") or []
    _render_nonfinite(console, bad, "NaN/Inf in the dump (run, diff and taps take it with --allow-nonfinite):")
    verdict = "[green]valid[/green]" if desc["ok"] else f"[red]invalid:[/red] {escape(desc['verdict'])}"
    if desc["ok"] and bad:
        verdict += escape(f", with NaN/Inf in {', '.join(r['name'] for r in bad)} (run, diff and taps need "
                          "--allow-nonfinite)")
    console.print(f"verdict: {verdict}", soft_wrap=True, highlight=False)


def render_presets(console: Console, presets: list[dict]) -> None:
    t = Table(title="presets (kdadbg.cases)", title_justify="left")
    for col in ("name", "B", "T", "H", "HV", "K", "V", "gate", "C", "layout", "dtype", "note"):
        t.add_column(col)
    for p in presets:
        t.add_row(p["name"], *(str(p[k]) for k in ("B", "T", "H", "HV", "K", "V")), p["gate"], str(p["chunk_size"]),
                  p["state_layout"], p["dtype"], p["note"])
    console.print(t)


def render_generated(console: Console, info: dict) -> None:
    sizes = " ".join(f"{k}={v}" for k, v in info["sizes"].items())
    console.print(f"wrote {escape(info['out'])}: preset {info['preset']} (seed {info['seed']}), {sizes}, "
                  f"{info['dtype']}, {info['bytes']} bytes", soft_wrap=True, highlight=False)


def render_tap_list(console: Console) -> None:
    from kdadbg_kernels.taps import TAPS

    t = Table(title="taps (registry v1)", title_justify="left")
    for col in ("tap", "stage", "per-chunk shape", "meaning"):
        t.add_column(col)
    for tap in TAPS:
        t.add_row(tap.name, tap.stage, escape(_shape(tap.shape)), escape(tap.meaning))  # dS[c+1] is no markup
    console.print(t)


def tap_table_markdown() -> str:
    """The tap registry as the Markdown table the README carries (a test keeps them in sync)."""
    from kdadbg_kernels.taps import TAPS

    lines = ["| tap | stage | per-chunk shape | meaning |", "|---|---|---|---|"]
    for tap in TAPS:
        lines.append(f"| `{tap.name}` | {tap.stage} | `{_shape(tap.shape)}` | {tap.meaning} |")
    return "\n".join(lines)


def render_export(console: Console, info: dict) -> None:
    ids = info["chunks"]
    lo, hi = (ids[0], ids[-1] + 1) if ids else (0, 0)
    heads = ",".join(str(h) for h in info["heads"])
    console.print(f"wrote {escape(info['out'])} ({info['bytes']} bytes) from {info['source']} on {info['device']}: "
                  f"{len(info['taps'])} taps, chunks {lo}:{hi} of {info['n_chunks']}, heads {heads}; "
                  + (f"outputs {', '.join(info['outputs'])} (whole tensors, {info['outputs_bytes']} bytes; "
                     f"--no-outputs leaves them out)" if info["outputs"] else "no outputs (--no-outputs)"),
                  soft_wrap=True, highlight=False)
    if info["nonfinite"]:
        colour = "yellow" if info.get("nonfinite_explained") else "red"
        console.print(f"[{colour}]non-finite values in:[/{colour}] {', '.join(info['nonfinite'])}", soft_wrap=True)
        if info.get("overflow_note"):
            console.print(f"note: {escape(info['overflow_note'])}", soft_wrap=True, highlight=False)
        if info.get("decay_note"):
            console.print(f"note: {escape(info['decay_note'])}", soft_wrap=True, highlight=False)
    if info.get("not_provided"):  # asked for (or applying) but not written: the source does not provide them
        console.print(escape(f"not provided by {info['source']}: {', '.join(info['not_provided'])}"), soft_wrap=True,
                      highlight=False)


@contextmanager
def progress_display(console: Console):
    """A ``progress(stage, done, total)`` callable drawing rich progress bars on ``console``.

    When ``console`` is not a terminal (stderr redirected to a log), rich draws nothing; there it
    prints a line when a stage starts and ends, and in between at most one every 5 s."""
    if not console.is_terminal:
        start: dict[str, float] = {}
        last: dict[str, float] = {}

        def lines(stage: str, done: int, total: int) -> None:
            now = time.perf_counter()
            first = stage not in start
            t0 = start.setdefault(stage, now)
            if first or done >= total or now - last[stage] >= 5.0:
                last[stage] = now
                console.print(f"{stage}: {done}/{total} ({now - t0:.1f} s)", highlight=False, soft_wrap=True)

        yield lines
        return
    bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)
    tasks: dict[str, int] = {}

    def progress(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bars.add_task(stage, total=total)
        bars.update(tasks[stage], completed=done, total=total)

    with bars:
        yield progress


def render_run(console: Console, result) -> None:
    """The ``kdadbg run`` table: one row per output and gradient, then the verdict."""
    from ..compare.carried import COHERENT, heads_text, unchecked_hint

    cfg = result.config
    t = Table(title=f"{escape(result.dump)}: --impl {escape(result.impl.get('name', '?'))} ({result.precision}, "
                    f"{result.device}) vs float64 reference", title_justify="left")
    for col in ("tensor", "shape", "compared", "max |err|", "at", "ratio", "cosine", "NaN/Inf one side", "tol",
                "verdict"):
        t.add_column(col, justify="left" if col in ("tensor", "shape", "at", "verdict") else "right")
    for r in result.tensors:
        if not r.compared:   # nothing compared: no figure is a measurement, and no verdict
            t.add_row(r.name, _shape(r.shape), "0", "—", "—", "—", "—", str(r.nonfinite), _num(r.tol),
                      "[yellow]not compared[/yellow]" + (" (NaN/Inf on both sides)" if r.nonfinite == 0 and
                                                          math.prod(r.shape) else ""))
            continue
        verdict = "[green]pass[/green]" if r.passed else "[magenta]UNREP[/magenta]" if r.unrep else \
            "[yellow]carried[/yellow]" if r.carried is not None else "[bold red]FAIL[/bold red]"
        at = _shape(r.max_index) if math.isfinite(r.max_abs) or r.nonfinite else "—"  # where a figure is, only
        t.add_row(r.name, _shape(r.shape), str(r.count), _fig(r.max_abs), at, _fig(r.ratio),
                  f"{r.cosine:.8f}" if r.cosine_defined and math.isfinite(r.cosine) else "—", str(r.nonfinite),
                  _num(r.tol), verdict)
    # one reason shared by several rows (do all zero: every gradient) is written once, under the table
    whys = [why.removeprefix('not compared: ') for why in result.not_provided.values()]
    shared = [w for w in dict.fromkeys(whys) if whys.count(w) > 1 and len(w) > 40]
    for (name, why), w in zip(result.not_provided.items(), whys):
        word = missing_word([why])
        t.add_row(name, "—", "0", "—", "—", "—", "—", "—", "—",
                  f"[yellow]{word}[/yellow] " + (f"(reason {shared.index(w) + 1}, below)" if w in shared
                                                  else f"({escape(w)})"))
    console.print(t)
    for i, w in enumerate(shared):
        console.print(f"reason {i + 1} ({whys.count(w)} rows): {escape(w)}", soft_wrap=True, highlight=False)
    for note in result.notes:
        console.print(f"note: {escape(note)}", soft_wrap=True, highlight=False)
    lb = f" lower_bound={cfg.lower_bound}" if cfg.gate == "lower_bound" else ""   # the other gates have none
    console.print(f"config: chunk_size={cfg.chunk_size} gate={cfg.gate}{lb} "
                  f"scale={cfg.scale:.6g} qk_l2norm={cfg.qk_l2norm} beta_sigmoid={cfg.beta_sigmoid} "
                  f"state_layout={cfg.state_layout}", soft_wrap=True, highlight=False)
    for r in result.tensors:
        if r.passed is False and r.unrep and r.precision_floor is not None and r.storage is None:
            console.print(f"UNREP: {r.name} ratio {r.ratio:.3g} over tol {r.tol:g}: {escape(r.unrep)}",
                          soft_wrap=True, highlight=False)
    unrep = [r for r in result.tensors if r.passed is False and r.unrep and r.storage is not None]
    if unrep:   # one line: which, their storage, the rounding's ratio against the tolerances
        lo, hi = min(r.floor for r in unrep), max(r.floor for r in unrep)
        tols = sorted({r.tol for r in unrep})
        dtypes = sorted({r.storage for r in unrep})
        grads = any(r.name.startswith("d") for r in unrep)   # autograd returns a 16-bit leaf's gradient so
        console.print(f"UNREP: {', '.join(r.name for r in unrep)} returned in {', '.join(dtypes)}"
                      f"{' (a gradient comes back in its input' + chr(39) + 's dtype)' if grads else ''}, whose rounding "
                      f"alone is ratio {lo:.2g}{'' if hi == lo else f' to {hi:.2g}'} against tol "
                      f"{', '.join(f'{t:g}' for t in tols)}: within bf16 mode's tolerances, which "
                      f"--precision bf16 applies to every tensor", soft_wrap=True, highlight=False)
    for r in result.tensors:
        if r.carried is not None:
            console.print(f"carried: {r.name} over its tolerance, carried in from dg (not a failure): the exact sum "
                          f"of the implementation's own dg is at ratio {r.carried:.3g} from the reference, and its {r.name} "
                          f"at ratio {r.carried_own:.3g} from that sum at worst, head by head (within tol {r.tol:g}, "
                          f"or float32's rounding of the sum); dg is judged on its own row",
                          soft_wrap=True, highlight=False)
        if r.sum_unchecked is not None:   # compare.carried.head_split: the split, head by head; the floor judges
            u = r.sum_unchecked
            worst = max(u["heads"], key=lambda d: d["own"])
            heads = heads_text(u["heads"], lambda d: f"head {d['head']} {d['own']:.3g} from the exact sum of the "
                                                     f"returned dg, its reach {d['reach']:.3g}")
            console.print(f"sum not checkable: {r.name} over its tolerance, dg came back in {u['dtype']}, and each "
                          f"head over it is within how far rounding that dg can move the head's sum, its reach "
                          f"({heads}). Of its error over the tensor, the exact sum of the returned dg is "
                          f"{u['carried']:.3g} from the reference (dg's part, judged on dg's row) and its {r.name} "
                          f"{u['own']:.3g} from that sum (the sum's own part, or dg's rounding: they cannot be told "
                          f"apart); {unchecked_hint(worst['carried'], worst['own'])}. The noise floor judges it: "
                          + ("UNREP (above)" if r.unrep else "over ten times its floor, or a floor within the "
                             "tolerance, a failure"), soft_wrap=True, highlight=False)
        if r.sum_wrong is not None:
            heads = heads_text(r.sum_wrong["heads"], lambda d: f"head {d['head']} {d['own']:.3g} from the exact sum "
                                                               f"of the returned dg, beyond its reach {d['reach']:.3g}")
            console.print(f"wrong sum: {r.name} over its tolerance, and its sum is wrong: {heads}"
                          + (f" (dg came back in {r.sum_wrong['dtype']}: a head within its reach could be told "
                             f"neither right nor wrong)" if r.sum_wrong["dtype"] else
                             " (its reach: its tolerance, or float32's rounding of the sum)"),
                          soft_wrap=True, highlight=False)
        if r.coherent is not None:
            console.print(f"not carried in: {r.name} over its tolerance, and dg's error sums into it coherently "
                          f"({r.coherent:.3g} against at most {COHERENT:g} for rounding): a bias in dg, which its own "
                          f"row cannot show, not dg's rounding carried in", soft_wrap=True, highlight=False)
    console.print(run_verdict_line(result), soft_wrap=True, highlight=False)


def run_counts(result) -> str:
    """How much a run compared, for every verdict line: elements and tensors compared, tensors not
    compared, outputs not provided, timings."""
    done = sum(r.compared for r in result.tensors)
    parts = [f"{result.elements} elements compared in {done} of {result.applying} tensors"]
    nc = result.not_compared
    if nc:
        parts.append(f"{len(nc)} not compared ({', '.join(r.name for r in nc)}: NaN/Inf on both sides)")
    missing = result.missing
    if missing:
        parts.append(f"{len(missing)} {missing_word(result.not_provided[n] for n in missing)} ({', '.join(missing)})")
    from ..dump import NOT_ASKED

    asked = [n for n, why in result.not_provided.items() if why == NOT_ASKED]
    if asked:
        parts.append(f"{', '.join(asked)} {NOT_ASKED}")
    outside = len(result.not_provided) - len(missing) - len(asked)
    if outside:
        parts.append(f"{outside} outside the window")
    times = ", ".join(f"{k} {v:.2f} s" for k, v in result.timings.items())
    return "; ".join(parts) + (f"; {times}" if times else "")


def run_verdict_line(result) -> str:
    """The last line of ``kdadbg run``: the verdict and how much it rests on (rich markup)."""
    counts = run_counts(result)
    verdict = result.verdict
    unrep = [r for r in result.tensors if r.passed is False and r.unrep]
    if verdict == "fail":
        failed = [r.name for r in result.tensors if r.failed]
        low = "; it returns tensors in 16 bits: if it computes in bf16 too, --precision bf16 is the mode to " \
              "judge it in" if unrep and result.precision == "fp32" else ""
        what = f"{', '.join(failed)} over tolerance" if failed else \
            "the two sides disagree on where the outputs are NaN/Inf"
        return (f"[bold red]FAIL[/bold red]: {escape(what)} ({escape(counts)}); `kdadbg diff` locates the first "
                f"diverging chunk and stage{low}")
    if verdict == "not_compared":
        return (f"[bold yellow]NOT COMPARED[/bold yellow]: no element was compared: every element of every "
                f"tensor is NaN/Inf on both sides; nothing was checked ({escape(counts)})")
    judged = sum(bool(r.passed) for r in result.tensors)
    carried = [r.name for r in result.tensors if r.passed is False and r.carried is not None]
    what = f"{_plural(judged, 'tensor')} within tolerance" + (f", {len(unrep)} UNREP ({', '.join(r.name for r in unrep)})"
                                                    if unrep else "") + \
        (f", {len(carried)} carried in from dg ({', '.join(carried)})" if carried else "")
    if verdict == "partial":
        return (f"[bold yellow]PARTIAL[/bold yellow]: {what}, but not every output and gradient was compared: "
                f"not a full pass (exit 3) ({escape(counts)})")
    return f"[bold green]PASS[/bold green]: {what} ({escape(counts)})"


def _captured_as(d: dict) -> str:
    """What a captured dump holds, short: ``  B=2 T=40 H=2 K=16 V=16 bfloat16 chunk=64 gate=softplus`` (``T=256
    N=3`` for varlen, ``HV`` under GVA); '' for a manifest entry without them."""
    z = d.get("sizes")
    if not z:
        return ""
    rows = f"T={z['T']} N={z['N']}" if z.get("N") is not None else f"B={z['B']} T={z['T']}"
    hv = f" HV={z['HV']}" if z.get("HV") not in (None, z["H"]) else ""
    return (f"  {rows} H={z['H']}{hv} K={z['K']} V={z['V']} {d['dtype']} chunk={d['chunk_size']} "
            f"gate={d['gate']}")


def render_captured(console: Console, err: Console, result: dict, status: int) -> None:
    """``kdadbg capture``: one stdout line per dump written; the summary on stderr, ending with the
    command's exit code and, where it differs, capture's own (``status``)."""
    for d in result["dumps"]:
        where = f"step {d['step']} call {d['call']}" + (f" module {d['module']}" if d["module"] else "") + (
            f" rank {d['rank']}" if d["rank"] is not None else "")
        # (the reason is "nonfinite" under --when nonfinite: the tensors follow it, not the word again)
        bad = (f"{': ' if d['reason'] == 'nonfinite' else ', NaN/Inf in: '}{','.join(d['nonfinite'])}"
               if d["nonfinite"] else "")
        inside = f", inside {d['inside']}" if d.get("inside") else ""
        console.print(escape(f"{d['dump']}  {where}  {d['impl']} ({d['reason']}{bad}{inside}){_captured_as(d)}"),
                      soft_wrap=True, highlight=False)
    nested = [d for d in result["dumps"] if d.get("inside")]
    if nested:
        print_note(err, f"{len(nested)} of the dumps {'is a call' if len(nested) == 1 else 'are calls'} made inside "
                        f"another captured call (a target that calls another target, e.g. a wrapper and the "
                        f"function it calls): the same attention may be in two dumps, each as its own call saw it")
    for e in result["errors"]:
        print_error(err, e)
    for u in result["unresolved"]:
        name = u["target"] if u["target"] == u["name"] else f"{u['target']} ({u['name']})"
        print_error(err, f"--target {name}: not patched in any process of the command: {u['why']}; expected an "
                         f"importable module that the command imports, with a module-level function of that name")
    for t in result.get("uncalled", []):
        print_error(err, f"--target {t}: patched but never called in any process of the command; expected the "
                         f"function the command calls for KDA (capture sees calls made through module attributes; a "
                         f"reference kept in a dict or on a class while its module was imported calls it unseen)")
    if result.get("call_note"):
        print_note(err, result["call_note"])
    if result.get("selection_error"):   # the selection options left none of the calls seen to write
        print_error(err, result["selection_error"])
    if result.get("selection_note"):
        print_note(err, result["selection_note"])
    if result.get("skipped_error"):   # every call selected skipped: nothing captured
        print_error(err, result["skipped_error"])
    reasons = sorted({s["why"] for s in result["skipped"]})
    skipped = f"; {len(result['skipped'])} not captured ({'; '.join(reasons)})" if reasons else ""
    refused, failed = result["refused"], len(result["errors"]) - result["refused"]
    why = ([f"{refused} refused: their files exist and are never overwritten; --force replaces them, or use "
            f"another --out"] if refused else []) + (
        [f"{failed} could not be written (errors above)"] if failed else [])
    unwritten = f"; {len(result['errors'])} not written ({'; '.join(why)})" if why else ""
    missed = f"; --target {', '.join(u['target'] for u in result['unresolved'])} never patched" \
        if result["unresolved"] else ""
    uncalled = result.get("uncalled", [])
    missed += f"; --target {', '.join(uncalled)} never called" if uncalled else ""
    ends = f"the command exited with {result['exit_code']}" + (
        f"; capture exits {status}" if status != result["exit_code"] else "")
    if not result["processes"] and result["exit_code"] > 128:   # killed by a signal before any exit hook ran
        n = result["exit_code"] - 128
        try:
            import signal

            name = f" ({signal.Signals(n).name})"
        except ValueError:
            name = ""
        err.print(f"capture: no manifest came back: the command was ended by signal {n}{name} before it wrote one",
                  soft_wrap=True, highlight=False)
    elif not result["processes"]:
        err.print("capture: no manifest came back: was the command a Python process with site enabled "
                  "(not python -S or -I)?", soft_wrap=True, highlight=False)
    no_grad = result.get("calls_no_grad", 0)
    off = f"; {no_grad} ran with grad mode off (torch.no_grad or inference_mode): no backward to capture" \
        if no_grad else ""
    err.print(escape(f"capture: {_plural(len(result['dumps']), 'dump')} in {result['out']} from "
                     f"{_plural(result['calls_seen'] + no_grad, 'KDA call')}{off}{skipped}{unwritten}{missed}; {ends}"),
              soft_wrap=True, highlight=False)
