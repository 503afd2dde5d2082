"""Pick launch variants from a ``stage_bench.py`` JSON-lines file for the next command of the same GPU call.

    python benchmarks/pick_variants.py STAGES.jsonl [--stage fwd_prepare] [--baseline default] [--margin 0.01]
        --groups PREP_WARPS,PREP_BK PREP_WU_WARPS,PREP_WU_BK

Each group is a set of knobs that act on one kernel; from each group the variant (a line whose overrides
are all in the group) with the lowest time of ``--stage`` wins if it beats the line tagged
``--baseline`` by more than ``--margin`` (a fraction). Prints the winners as ``KDADBG_NAME=value`` words
for ``env`` (nothing when the defaults stand) and, on stderr, why.
"""

from __future__ import annotations

import argparse
import json
import sys


def pick(lines: list[dict], stage: str, groups: list[set[str]], baseline: str, margin: float) -> dict[str, str]:
    base = [x for x in lines if x["tag"].split(" ")[0] == baseline]
    if not base:
        raise SystemExit(f"pick_variants: no line tagged {baseline!r}")
    t0 = base[0]["ms"][stage]
    chosen: dict[str, str] = {}
    for group in groups:
        best, best_t = None, t0 * (1 - margin)
        for x in lines:
            knobs = {k.removeprefix("KDADBG_"): v for k, v in x["knobs"].items()}
            if knobs and set(knobs) <= group and x["ms"][stage] < best_t:
                best, best_t = knobs, x["ms"][stage]
        print(f"pick_variants: {sorted(group)}: {best or 'defaults'} ({stage} {best_t if best else t0:.3f} "
              f"against {t0:.3f} ms)", file=sys.stderr)
        chosen.update({f"KDADBG_{k}": v for k, v in (best or {}).items()})
    return chosen


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages")
    ap.add_argument("--stage", default="fwd_prepare")
    ap.add_argument("--groups", nargs="+", required=True, help="comma-separated knob names (without KDADBG_)")
    ap.add_argument("--baseline", default="default")
    ap.add_argument("--margin", type=float, default=0.01)
    a = ap.parse_args(argv)
    with open(a.stages) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    chosen = pick(lines, a.stage, [set(g.split(",")) for g in a.groups], a.baseline, a.margin)
    print(" ".join(f"{k}={v}" for k, v in chosen.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
