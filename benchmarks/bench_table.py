"""Markdown tables of a ``bench.py`` or ``bench_merge.py`` JSON: the tables that README's Performance section
and ``docs/benchmarks.md`` quote, made from the file rather than copied by hand.

    python benchmarks/bench_table.py [docs/benchmarks.json] [--commits SHA[,SHA...]]

Three tables: ours against fla (forward, forward + backward, their ratios, peak memory), ours against
FlashKDA's forward (our training forward, our inference forward at the better of chunks 64 and 16), and the
taps-on ratios (the latest timing per configuration). A fourth where fla's own time moved by more than
5 % between the calls a merged file holds (its current and superseded rows): fla's fastest and slowest
timing and ours against the fastest, the ratio that does not flatter us. Per configuration and peer the
table takes the last row that timed that peer (a merged file's rows are in timing order). A ratio that
meets issue 23's target is bold (forward and FlashKDA <= 0.9, forward + backward <= 0.85). Each row names
the commit it was timed at; ``--commits`` keeps the rows of those commits only. A file that is not bench.py's JSON is refused with one
line naming it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_merge import env_knobs, load  # noqa: E402

TARGETS = {"fwd": 0.9, "fwdbwd": 0.85, "flashkda": 0.9}


def _ms(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _ratio(x, target) -> str:
    if x is None:
        return "-"
    return f"**{x:.3f}**" if x <= target else f"{x:.3f}"


def _shape(shape: str) -> str:
    return shape.replace("dense_", "").replace("_", " ").replace("varlen mixed6", "varlen")


def _where(row) -> str:
    return f"{row['setting']}, {_shape(row['shape'])}"


def _commit(row: dict, data: dict) -> str:
    """A merged file names each row's commit; a bench.py file names its own in ``env``."""
    return row.get("commit") or (data.get("env") or {}).get("commit") or "?"


def _label(row: dict, data: dict) -> str:
    """The commit column: the commit, with the knob overrides the row was timed under (a merged row's
    ``knobs``, a bench.py file's environment), e.g. ``c547650 EXP_FTZ=1``."""
    knobs = row.get("knobs") if "knobs" in row else (env_knobs(data) if "env" in data else {})
    return " ".join([_commit(row, data)[:7]] + [f"{k}={v}" for k, v in (knobs or {}).items()])


def _kept(commit: str, commits: set[str] | None) -> bool:
    """Whether ``--commits`` keeps a row of ``commit`` (full or abbreviated on either side)."""
    return commits is None or any(commit.startswith(c) or c.startswith(commit) for c in commits)


def fla_table(rows: list[dict]) -> list[str]:
    out = ["| setting, shape | ours fwd | fla fwd | fwd ratio | ours f+b | fla f+b | f+b ratio | GiB ours / fla "
           "| commit |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o, f = r["runs"]["ours"], r["runs"]["fla"]
        out.append(f"| {_where(r)} | {_ms(o.get('fwd_ms'))} | {_ms(f.get('fwd_ms'))} | "
                   f"{_ratio(r['ratios'].get('ours/fla_fwd'), TARGETS['fwd'])} | {_ms(o.get('fwdbwd_ms'))} | "
                   f"{_ms(f.get('fwdbwd_ms'))} | {_ratio(r['ratios'].get('ours/fla_fwdbwd'), TARGETS['fwdbwd'])} | "
                   f"{o.get('peak_mem_gib', 0):.2f} / {f.get('peak_mem_gib', 0):.2f} | {r['_label']} |")
    return out


def flashkda_table(rows: list[dict]) -> list[str]:
    out = ["| shape | ours fwd | ours inference fwd (chunk) | FlashKDA fwd | ours / FlashKDA | inference / FlashKDA "
           "| GiB ours / inference / FlashKDA | commit |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        runs = r["runs"]
        infer = min((runs[n]["fwd_ms"], c, runs[n].get("peak_mem_gib", 0))
                    for n, c in (("ours_infer", 64), ("ours_infer_c16", 16)) if n in runs)
        out.append(f"| {_shape(r['shape'])} | {_ms(runs['ours'].get('fwd_ms'))} | {_ms(infer[0])} ({infer[1]}) | "
                   f"{_ms(runs['flashkda'].get('fwd_ms'))} | "
                   f"{_ratio(r['ratios'].get('ours/flashkda_fwd'), TARGETS['flashkda'])} | "
                   f"{_ratio(r['ratios'].get('ours_infer/flashkda_fwd'), TARGETS['flashkda'])} | "
                   f"{runs['ours'].get('peak_mem_gib', 0):.2f} / {infer[2]:.2f} / "
                   f"{runs['flashkda'].get('peak_mem_gib', 0):.2f} | {r['_label']} |")
    return out


def taps_table(data: dict, commits: set[str] | None) -> list[str]:
    latest = {}
    for t in data.get("taps") or [r for r in data["results"] if r.get("taps_ratios")]:
        if _kept(_commit(t, data), commits):
            latest[t["name"]] = dict(t, _label=_label(t, data))
    out = ["| setting, shape | taps on / off, three separate pairs (forward + backward) | commit |", "|---|---|---|"]
    for name, t in latest.items():
        setting = next(x for x in ("lower_bound", "softplus", "pregated") if name.startswith(x))
        pairs = " / ".join(f"{x:.3f}" for x in t["taps_ratios"])
        out.append(f"| {setting}, {_shape(name[len(setting) + 1:])} | {pairs} | {t['_label']} |")
    return out


MOVED = 1.05  # fla's slowest over its fastest timing of a configuration above which fla_moves lists it


def fla_moves(data: dict, rows: list[dict]) -> list[str]:
    """For each row of ``rows`` (the current fla rows), fla's timings of the same configuration in every row
    the file holds (``results`` and ``superseded``); where the slowest exceeds the fastest by more than
    ``MOVED`` in the forward or forward + backward, a line with both and ours against the fastest."""
    every = data["results"] + (data.get("superseded") or [])
    out = ["| setting, shape | fla fwd, fastest - slowest (calls) | ours fwd / fla's fastest | fla f+b, fastest - "
           "slowest | ours f+b / fla's fastest | commit |", "|---|---|---|---|---|---|"]
    for r in rows:
        fla = [x["runs"]["fla"] for x in every
               if (x["setting"], x["shape"]) == (r["setting"], r["shape"]) and "fla" in x.get("runs", {})]
        cols = []
        for k, target in (("fwd_ms", TARGETS["fwd"]), ("fwdbwd_ms", TARGETS["fwdbwd"])):
            t = [f[k] for f in fla if f.get(k)]
            ours = r["runs"]["ours"].get(k)
            cols.append((min(t), max(t), len(t), None if ours is None else ours / min(t), target))
        if all(hi <= MOVED * lo for lo, hi, *_ in cols):
            continue
        cells = [f"{lo:.3f} - {hi:.3f} ({n})" + f" | {_ratio(x, target)}" for lo, hi, n, x, target in cols]
        out.append(f"| {_where(r)} | {cells[0]} | {cells[1]} | {r['_label']} |")
    return out


def tables(data: dict, commits: set[str] | None = None) -> str:
    rows = [dict(r, _commit=_commit(r, data), _label=_label(r, data)) for r in data["results"]]
    fla, fk = ([r for r in {(r["setting"], r["shape"]): r for r in rows if peer in r["runs"]}.values()
                if _kept(r["_commit"], commits)]
               for peer in ("fla", "flashkda"))  # per configuration the last row that timed the peer
    parts = []
    if fla:
        parts += ["Ours against fla (ms, `do_bench` medians; ratio ours / fla, lower is better):", "", *fla_table(fla)]
        moved = fla_moves(data, fla)
        if len(moved) > 2:
            parts += ["", f"Where fla's own time moved by more than {MOVED - 1:.0%} between calls (ms; ours against "
                      "fla's fastest timing):", "", *moved]
    if fk:
        parts += ["", "Ours against upstream FlashKDA's forward (lower-bound gate; ms):", "", *flashkda_table(fk)]
    taps = taps_table(data, commits)
    if len(taps) > 2:
        parts += ["", "Every tap on for a 64-chunk window against taps off:", "", *taps]
    if not parts:
        raise SystemExit("bench_table: no rows" + (f" of commits {', '.join(sorted(commits))}" if commits else ""))
    return "\n".join(parts) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="?", default="docs/benchmarks.json", type=Path)
    ap.add_argument("--commits", default=None, help="comma list: only rows timed at these commits")
    a = ap.parse_args(argv)
    commits = set(a.commits.split(",")) if a.commits else None
    try:
        data = load(a.json)
    except SystemExit as e:  # bench_merge's one-line refusal, under this script's name
        raise SystemExit(str(e).replace("bench_merge:", "bench_table:", 1)) from None
    sys.stdout.write(tables(data, commits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
