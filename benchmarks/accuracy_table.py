"""The README's accuracy table from the judge's JSON files (benchmarks/gpu_judge_dumps.py): for each dump, each
implementation's ratio to the float64 reference per output and gradient, with its verdict.

    python3 benchmarks/accuracy_table.py JUDGE_DIR > docs/gpu/adapters/accuracy_table.md
"""

import json
import sys
from pathlib import Path

IMPLS = [("ours_fp32", "ours, fp32 mode"), ("ours", "ours, bf16 mode"),
         ("fla_run", "fla (`--impl fla`)"), ("flashkda_fork", "FlashKDA fork"),
         ("flashkda_upstream", "FlashKDA upstream (forward)")]
COLS = ["o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias"]


def main():
    d = Path(sys.argv[1])
    tags = sorted({p.name[: p.name.rindex(".", 0, p.name.rindex("."))] for p in d.glob("*.json")})
    print("| dump | implementation | verdict | " + " | ".join(COLS) + " |")
    print("|---|---|---|" + "---|" * len(COLS))
    for tag in tags:
        for key, label in IMPLS:
            f = d / f"{tag}.{key}.json"
            if not f.exists():
                continue
            doc = json.loads(f.read_text())
            r = {t["name"]: t for t in doc["tensors"]}
            cells = []
            for c in COLS:
                t = r.get(c)
                cells.append("—" if t is None else (f"**{t['ratio']:.2e}**" if not t["pass"] else f"{t['ratio']:.2e}"))
            print(f"| {tag} | {label} | {doc['verdict']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
