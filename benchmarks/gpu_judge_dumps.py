"""Judge captured dumps in one process (compiles once): for each dump, our kernels (`run`, bf16), fla's
outputs from the step (`diff --against` its theirs file, bf16), fla rerun on it (`run --impl fla` and
`diff --impl fla`, bf16). One line per command into the summary; logs and JSON into a folder.

    python3 benchmarks/gpu_judge_dumps.py DUMPS_DIR LOG_DIR SUMMARY
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_fla import cli   # noqa: E402  (one kdadbg command in this process, its exit code)


DEVICE = "cuda"


def main():
    dumps, logs, summary = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    logs.mkdir(parents=True, exist_ok=True)
    lines = []
    for d in sorted(dumps.rglob("*.safetensors")):
        if d.name.endswith(".theirs.safetensors"):
            continue
        theirs = d.with_name(d.name.replace(".safetensors", ".theirs.safetensors"))
        tag = f"{d.parent.name}.{d.stem}"
        cmds = {"ours": ["run", str(d), "--device", DEVICE, "--precision", "bf16"],
                "theirs": ["diff", str(d), "--against", str(theirs), "--device", DEVICE, "--precision", "bf16"],
                "fla_run": ["run", str(d), "--impl", "fla", "--device", DEVICE, "--precision", "bf16"],
                "fla_diff": ["diff", str(d), "--impl", "fla", "--device", DEVICE, "--precision", "bf16"]}
        cli(["inspect", str(d)], logs / f"{tag}.inspect.log")
        lines.append(f"{tag}:")
        for name, args in cmds.items():
            js = logs / f"{tag}.{name}.json"
            code = cli([*args, "--json", str(js), "--force"], logs / f"{tag}.{name}.log")
            try:
                doc = json.loads(js.read_text())
            except Exception as e:   # noqa: BLE001 - the log says why
                lines.append(f"  {name}: exit {code}, no JSON ({type(e).__name__})")
                continue
            if args[0] == "run":
                rat = ", ".join(f"{t['name']} {t['ratio']:.2e}" for t in doc["tensors"])
                lines.append(f"  {name}: exit {code}, {doc['verdict']}: {rat}")
            else:
                c, fd, fb = doc["compared"], doc["first_divergence"], doc["first_bug"]
                lines.append(f"  {name}: exit {code}, {doc['verdict']}: {c['cells']} cells ({c['row_cells']} rows), "
                             f"ok {c['ok']} drift {c['drift']} bug {c['bug']} unrep {c['unrep']}; first "
                             f"{None if fd is None else (fd['tap'], fd['chunk'], fd['head'], fd['label'])}; first bug "
                             f"{None if fb is None else (fb['tap'], fb['chunk'], fb['head'], round(fb['ratio'], 5))}")
        summary.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
