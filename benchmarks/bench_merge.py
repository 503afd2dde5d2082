"""Merge the JSON of several ``benchmarks/bench.py`` runs into one file of current numbers.

    python benchmarks/bench_merge.py RUN.json [RUN.json ...] [--out docs/benchmarks.json] [--note TEXT ...]
                                     [--only RUN.json=SHAPE[,SHAPE...] ...]

A device call has ten minutes, so one benchmark of every shape takes several calls, each writing its own
``benchmarks.json`` (``docs/gpu/<round>/<call>/``). This writes one file from them: for each setting,
shape and peer (ours, fla, FlashKDA) the row of the last file given that timed it (``results``,
each with its ``source`` file and ``commit``, and ``knobs`` where the run's environment overrode any (e.g. a
knob timed before it became the default); a setting and shape may keep two rows, e.g. one against fla
and a later one against FlashKDA alone, each with ours from its own process), the rows left with no peer
of their own (``superseded``, kept: a row timed again is not dropped), every taps-on
timing (``taps``), every knob A/B run beside the default (``knob_ab``), and each file's environment (commit,
date, versions, GPU, command) under ``sources``. A file that is missing, is not JSON or is not a bench.py
result (schema 2) is refused with one line naming it; the output is written only when every input read.
``--only RUN.json=SHAPE,...``: of that file, only those shapes' rows may be current (e.g. the shapes where
the default it ran is still the default); its other rows go to ``superseded``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise SystemExit(f"bench_merge: {path}: cannot read ({e.strerror})")
    except json.JSONDecodeError as e:
        raise SystemExit(f"bench_merge: {path}: not JSON ({e.msg}, line {e.lineno})")
    if not isinstance(data, dict) or data.get("schema") != 2 or not isinstance(data.get("results"), list):
        schema = data.get("schema") if isinstance(data, dict) else None
        raise SystemExit(f"bench_merge: {path}: expected bench.py's JSON (schema 2 with a results list), "
                         f"found {type(data).__name__} with schema {schema}")
    return data


def peers_of(row: dict) -> tuple[str, ...]:
    """What a row can be the current figure for: ours, and each peer it timed ours against (its runs other
    than ours and its variants)."""
    return ("ours", *sorted(t for t in (row.get("runs") or {}) if not t.startswith("ours")))


def env_knobs(data: dict) -> dict[str, str]:
    """The knob overrides a bench.py run was timed under (its environment's ``KDADBG_<NAME>``), by name."""
    env = (data.get("env") or {}).get("env") or {}
    return {k[len("KDADBG_"):]: v for k, v in sorted(env.items()) if k.startswith("KDADBG_")}


def merge(runs: list[tuple[str, dict]], notes: list[str] = (), only: dict[str, set[str]] | None = None) -> dict:
    """``runs``: ``(source, bench.py JSON)`` in priority order, the last winning: per setting and shape, each
    peer's figures are those of the last row that timed it (with ours from the same process, so each row's
    ratios stay within one process); a row left with no peer of its own is superseded. ``only``: per
    source, the shapes whose rows may be current (e.g. where that run's default is still the default);
    its other rows are kept as superseded."""
    only = only or {}
    rows: list[dict] = []
    taps, knob_ab, sources = [], [], {}
    for source, data in runs:
        env = data.get("env", {})
        sources[source] = env
        knobs = env_knobs(data)
        for r in data["results"]:
            runs_ = r.get("runs") or {}
            if "ours" not in runs_ or "fwd_ms" not in runs_["ours"]:
                continue  # skipped by the budget, or ours failed: nothing timed to keep
            rows.append({**r, "source": source, "commit": env.get("commit"), **({"knobs": knobs} if knobs else {})})
            if r.get("taps_ratios"):
                taps.append({"source": source, "commit": env.get("commit"), **({"knobs": knobs} if knobs else {}),
                             "name": r["name"],
                             **{k: r[k] for k in ("taps_fwdbwd_ms", "taps_ratios", "taps_first_call_s",
                                                  "taps_peak_mem_gib") if k in r}})
            variants = {k: {m: v[m] for m in ("fwd_ms", "fwdbwd_ms") if m in v}
                        for k, v in runs_.items() if k.startswith("ours@") and "fwd_ms" in v}
            if variants:
                base = runs_["ours"]
                knob_ab.append({"source": source, "commit": env.get("commit"), "name": r["name"],
                                "ours": {m: base[m] for m in ("fwd_ms", "fwdbwd_ms") if m in base}, **variants})
    latest: dict[tuple[str, str, str], int] = {}  # (setting, shape, peer) -> index of the last row timing it
    for i, r in enumerate(rows):
        if r["source"] in only and r["shape"] not in only[r["source"]]:
            continue
        for peer in peers_of(r):
            latest[(r["setting"], r["shape"], peer)] = i
    current = set(latest.values())
    order = list(dict.fromkeys((r["setting"], r["shape"]) for r in rows))
    by_key = {k: [i for i, r in enumerate(rows) if (r["setting"], r["shape"]) == k and i in current] for k in order}
    results = [rows[i] for k in order for i in by_key[k]]
    superseded = [r for i, r in enumerate(rows) if i not in current]
    return {"schema": 2, "merged_from": [s for s, _ in runs], "sources": sources,
            "settings": sorted({k[0] for k in order}, key=["pregated", "softplus", "lower_bound"].index),
            "results": results, "superseded": superseded, "taps": taps, "knob_ab": knob_ab,
            "notes": list(notes)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="bench.py JSON files, in priority order (the last wins)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.json", help="the merged file")
    ap.add_argument("--note", action="append", default=[], help="a note to record (repeatable)")
    ap.add_argument("--only", action="append", default=[], metavar="RUN.json=SHAPE[,SHAPE...]",
                    help="take only these shapes' rows of RUN.json as current (the rest superseded; repeatable)")
    a = ap.parse_args(argv)
    runs = [(_rel(p), load(p)) for p in a.runs]
    only = {}
    for o in a.only:
        path, sep, shapes = o.partition("=")
        src = _rel(Path(path))
        if not sep or not shapes or src not in dict(runs):
            raise SystemExit(f"bench_merge: --only {o!r}: expected RUN.json=SHAPE[,SHAPE...] naming one of the runs")
        names = set(shapes.split(","))
        known = {r["shape"] for r in dict(runs)[src]["results"]}
        if names - known:
            raise SystemExit(f"bench_merge: --only {o!r}: {src} has no rows of {', '.join(sorted(names - known))} "
                             f"(it has {', '.join(sorted(known))})")
        only[src] = names
    out = merge(runs, a.note, only)
    if not out["results"]:
        raise SystemExit("bench_merge: no timed row in " + ", ".join(s for s, _ in runs) + ": nothing written")
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"bench_merge: {len(out['results'])} rows ({len(out['superseded'])} superseded, {len(out['taps'])} taps "
          f"timings, {len(out['knob_ab'])} knob A/B) from {len(runs)} files -> {_rel(a.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
