"""Judge dumps in one process (compiles once): for each dump, our kernels (`run`, bf16 and fp32 modes), the
implementation's own outputs from the step where a theirs file lies beside it (`diff --against`, bf16), fla
rerun on it (`run --impl fla` and `diff --impl fla`, bf16), and then, for the lower-bound bf16 K = V = 128
dumps, each FlashKDA build named (`run --impl flashkda` in a subprocess with the build's tree on PYTHONPATH:
the two builds are both `flash_kda` and cannot share a process). One line per command into the summary;
logs and JSON into a folder.

    python3 benchmarks/gpu_judge_dumps.py DUMPS_DIR LOG_DIR SUMMARY [--flashkda NAME=PATHFILE ...]

PATHFILE is what ``benchmarks/build_flashkda.sh`` prints (its last line ``export PYTHONPATH=TREE:...``);
a build still running is waited for (up to 5 minutes) after everything else.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_fla import cli   # noqa: E402  (one kdadbg command in this process, its exit code)


DEVICE = os.environ.get("KDADBG_JUDGE_DEVICE", "cuda")   # cpu: a dry run of this script


def line_for(name: str, args: list[str], code: int, js: Path) -> str:
    try:
        doc = json.loads(js.read_text())
    except Exception as e:   # noqa: BLE001 - the log says why
        return f"  {name}: exit {code}, no JSON ({type(e).__name__})"
    if args[0] == "run":
        rat = ", ".join(f"{t['name']} {t['ratio']:.2e}" for t in doc["tensors"])
        return f"  {name}: exit {code}, {doc['verdict']}: {rat}"
    c, fd, fb = doc["compared"], doc["first_divergence"], doc["first_bug"]
    return (f"  {name}: exit {code}, {doc['verdict']}: {c['cells']} cells ({c['row_cells']} rows), "
            f"ok {c['ok']} drift {c['drift']} bug {c['bug']} unrep {c['unrep']}; first "
            f"{None if fd is None else (fd['tap'], fd['chunk'], fd['head'], fd['label'])}; first bug "
            f"{None if fb is None else (fb['tap'], fb['chunk'], fb['head'], round(fb['ratio'], 5))}")


def flashkda_fits(dump: Path) -> bool:
    """Whether FlashKDA takes the dump: its adapter's own ``supports``, where the only refusal allowed is the
    build missing from this process (the builds run in subprocesses)."""
    from kdadbg.dump import load_dump
    from kdadbg.impls.base import shapes_of
    from kdadbg.impls.flashkda import FlashKDA

    inputs, cfg = load_dump(str(dump))
    impl = FlashKDA()
    ok, why = impl.supports(impl.config_for(cfg)[0], shapes_of(inputs))
    return ok or why == impl.where


def tree_of(pathfile: Path, wait_s: float = 300.0) -> str | None:
    t0 = time.time()
    while time.time() - t0 < wait_s:
        text = pathfile.read_text() if pathfile.exists() else ""
        last = text.strip().splitlines()[-1] if text.strip() else ""
        if last.startswith("export PYTHONPATH="):
            return last.removeprefix("export PYTHONPATH=").removesuffix(":$PYTHONPATH")
        time.sleep(5)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dumps")
    ap.add_argument("logs")
    ap.add_argument("summary")
    ap.add_argument("--flashkda", action="append", default=[], help="NAME=PATHFILE of a FlashKDA build")
    a = ap.parse_args()
    from devices import use_device

    use_device("gpu_judge_dumps.py", DEVICE, cpu="KDADBG_JUDGE_DEVICE=cpu for a dry run")
    dumps, logs, summary = Path(a.dumps), Path(a.logs), Path(a.summary)
    logs.mkdir(parents=True, exist_ok=True)
    lines = []
    todo = [d for d in sorted(dumps.rglob("*.safetensors")) if not d.name.endswith(".theirs.safetensors")]
    for d in todo:
        theirs = d.with_name(d.name.replace(".safetensors", ".theirs.safetensors"))
        tag = f"{d.parent.name}.{d.stem}"
        cmds = {"ours": ["run", str(d), "--device", DEVICE, "--precision", "bf16"],
                "ours_fp32": ["run", str(d), "--device", DEVICE, "--precision", "fp32"]}
        if theirs.exists():
            cmds["theirs"] = ["diff", str(d), "--against", str(theirs), "--device", DEVICE, "--precision", "bf16"]
        cmds.update({"fla_run": ["run", str(d), "--impl", "fla", "--device", DEVICE, "--precision", "bf16"],
                     "fla_diff": ["diff", str(d), "--impl", "fla", "--device", DEVICE, "--precision", "bf16"]})
        cli(["inspect", str(d)], logs / f"{tag}.inspect.log")
        lines.append(f"{tag}:")
        for name, args in cmds.items():
            js = logs / f"{tag}.{name}.json"
            t0 = time.time()
            code = cli([*args, "--json", str(js), "--force"], logs / f"{tag}.{name}.log")
            lines.append(line_for(name, args, code, js) + f" ({time.time() - t0:.0f} s)")
            summary.write_text("\n".join(lines) + "\n")
    fits = [d for d in todo if flashkda_fits(d)]
    for spec in a.flashkda:
        build, pathfile = spec.split("=", 1)
        tree = tree_of(Path(pathfile))
        if tree is None:
            lines.append(f"flashkda {build}: no build ({pathfile} has no PYTHONPATH line)")
            continue
        env = {**os.environ, "PYTHONPATH": f"{tree}:{os.environ.get('PYTHONPATH', '')}"}
        for d in fits:
            tag = f"{d.parent.name}.{d.stem}"
            name = f"flashkda_{build}"
            js, log = logs / f"{tag}.{name}.json", logs / f"{tag}.{name}.log"
            args = ["run", str(d), "--impl", "flashkda", "--device", DEVICE, "--precision", "bf16", "--json", str(js),
                    "--force"]
            t0 = time.time()
            p = subprocess.run([sys.executable, "-m", "kdadbg", *args], env=env, cwd=REPO, capture_output=True,
                               text=True, timeout=180)
            log.write_text(f"$ kdadbg {' '.join(args)}\n{p.stdout}{p.stderr}\nexit {p.returncode}\n")
            lines.append(f"{tag}:\n" + line_for(name, args, p.returncode, js) + f" ({time.time() - t0:.0f} s)")
            summary.write_text("\n".join(lines) + "\n")
    summary.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
