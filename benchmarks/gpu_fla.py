"""``--impl fla`` on the GPU, every part in one process (fla compiles and autotunes per process).

Parts, in order (``--parts``, default all): ``tests`` (pytest tests/test_fla_adapter.py), ``cli``
(``kdadbg gen`` three GPU-sized dumps, then ``kdadbg run --impl fla`` and ``kdadbg diff --impl fla
--precision bf16`` on each), ``fault`` (a diff of the kimi dump with fla's stored state of chunk 40
perturbed). Installs nothing: fla-core 0.6.0 must be importable (see the README, "fla as an
implementation"). Writes under $OUT: ``summary.json``, ``pytest.log``, ``<dump>.{run,diff}.json``
and ``.log``, ``fault.json``.

By default each fla kernel runs its first autotune config (what the CPU runs do): the taps and
outputs are judged, not timed, and full autotuning of ~20 kernels for every new shape would take
most of the call. ``--autotune`` keeps fla's own autotuning.

    python3 benchmarks/gpu_fla.py [--parts tests,cli,fault] [--T 8192] [--H 8] [--autotune]
    TRITON_INTERPRET=1 python3 benchmarks/gpu_fla.py --parts cli,fault --device cpu --dtype float32 \
        --T 200 --H 1 --D 16 --fault-chunk 2          # the CPU dry run
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("FLA_FLASH_KDA", "0")
OUT = Path(os.environ.get("OUT", REPO / ".out"))


def cli(args: list[str], log: Path) -> int:
    """One kdadbg command in this process; its stdout and stderr to ``log``; the exit code."""
    from kdadbg.cli import main

    buf = io.StringIO()
    old = sys.argv
    sys.argv = ["kdadbg", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
        log.write_text(f"$ kdadbg {' '.join(args)}\n{buf.getvalue()}\nexit {code}\n")
    return code


def part_tests(summary: dict) -> None:
    import pytest

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        code = pytest.main(["-q", "-rs", "-p", "no:cacheprovider", str(REPO / "tests" / "test_fla_adapter.py")])
    (OUT / "pytest.log").write_text(buf.getvalue())
    summary["tests"] = {"exit": int(code), "tail": buf.getvalue().strip().splitlines()[-1:]}


def dumps(T: int, H: int, D: int, dtype: str) -> dict[str, list[str]]:
    size = ["--T", str(T), "--H", str(H), "--K", str(D), "--V", str(D), "--dtype", dtype]
    return {"basic_c64": ["--preset", "basic", "--B", "1", *size],     # chunk 16 preset, run at --chunk-size 64
            "fla_layer": ["--preset", "fla_layer", *size],
            "kimi_c64": ["--preset", "kimi_c64", *size]}


def part_cli(summary: dict, a) -> None:
    res = summary.setdefault("cli", {})
    for name, gen_args in dumps(a.T, a.H, a.D, a.dtype).items():
        dump = OUT / f"{name}.safetensors"
        over = ["--chunk-size", "64"] if name == "basic_c64" else []
        d = res[name] = {"gen": cli(["gen", str(dump), *gen_args, "--force"], OUT / f"{name}.gen.log")}
        for cmd in ("run", "diff"):
            t0 = time.time()
            d[cmd] = cli([cmd, str(dump), "--impl", "fla", "--precision", "bf16", "--device", a.device, *over,
                          "--json", str(OUT / f"{name}.{cmd}.json"), "--force"], OUT / f"{name}.{cmd}.log")
            d[f"{cmd}_s"] = round(time.time() - t0, 1)
        with contextlib.suppress(Exception):
            doc = json.loads((OUT / f"{name}.diff.json").read_text())
            d["diff_first_bug"] = doc.get("first_bug")
            d["diff_verdict"] = doc.get("verdict")
            d["diff_first_divergence"] = doc.get("first_divergence")


def part_fault(summary: dict, device: str, at: int = 40, dump: str | None = None) -> None:
    """fla handing its output kernel a wrong stored state for chunk ``at``: diff must name S there
    (on ``dump``, default the cli part's kimi_c64 dump)."""
    import torch

    from kdadbg.diff import diff_dump
    from kdadbg.dump import load_dump
    from kdadbg.impls import fla as F

    dump = Path(dump) if dump else OUT / "kimi_c64.safetensors"
    inputs, config = load_dump(str(dump))
    _, chunk_fwd, _ = F.load_fla(device)
    orig = chunk_fwd.chunk_gated_delta_rule_fwd_h

    first_row = {}

    def perturbed(*a, **kw):
        # like a real bug the fault follows the chunk's data: the first call records the planted chunk's first
        # key row; later calls (diff's window rerun on a slice of the sequence) perturb the chunk starting
        # with that row, or none
        h, v_new, ht = orig(*a, **kw)
        k = a[0] if a else kw["k"]
        C = kw.get("chunk_size", 64)
        if "k" not in first_row:
            first_row["k"] = k[0, at * C].clone()
        starts = [c for c in range(h.shape[1]) if c * C < k.shape[1] and torch.equal(k[0, c * C], first_row["k"])]
        if starts:
            c = starts[0]
            h = h.clone()
            h[:, c] += 0.5 * h[:, c].float().abs().mean().to(h.dtype) + 0.1
        return h, v_new, ht

    chunk_fwd.chunk_gated_delta_rule_fwd_h = perturbed
    try:
        res = diff_dump(inputs, config, F.Fla("bf16"), device=device, heads=(0,))
    finally:
        chunk_fwd.chunk_gated_delta_rule_fwd_h = orig
    first = res.first_divergence
    doc = {"planted": f"h[:, {at}] += 0.5 mean|h| + 0.1 (fla's stored state entering chunk {at})",
           "first_divergence": first, "first_bug": res.first_bug, "origin": res.origin,
           "named": bool(first and first["tap"] == "S" and first["chunk"] == at),
           "introduced": bool(res.origin and res.origin.get("verdict") == "introduced")}
    (OUT / "fault.json").write_text(json.dumps(doc, indent=1, default=str))
    summary["fault"] = {"named": doc["named"], "tap": first and first["tap"], "chunk": first and first["chunk"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="tests,cli,fault")
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--D", type=int, default=128, help="K = V")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run under the interpreter (float32 only)")
    ap.add_argument("--fault-chunk", type=int, default=40)
    ap.add_argument("--fault-dump", default=None, help="the fault part's dump (default: the cli part's kimi_c64)")
    ap.add_argument("--autotune", action="store_true", help="keep fla's autotuning (minutes per new shape)")
    a = ap.parse_args()
    from devices import use_device

    use_device("gpu_fla.py", a.device, cpu="--device cpu for a dry run under the interpreter (float32 only)")
    OUT.mkdir(parents=True, exist_ok=True)
    if not a.autotune:
        from kdadbg.impls.fla import _first_config_prune
        from triton.runtime.autotuner import Autotuner
        Autotuner.prune_configs = _first_config_prune(Autotuner.prune_configs)
    import torch

    from kdadbg.impls.fla import installed_version
    summary = {"fla": installed_version(), "torch": torch.__version__, "cuda": torch.cuda.is_available(),
               "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
               "autotune": a.autotune, "T": a.T, "H": a.H, "seconds": {}}
    parts = {"tests": lambda: part_tests(summary), "cli": lambda: part_cli(summary, a),
             "fault": lambda: part_fault(summary, a.device, a.fault_chunk, a.fault_dump)}
    for p in a.parts.split(","):
        t0 = time.time()
        try:
            parts[p]()
        except Exception:
            summary.setdefault("errors", {})[p] = traceback.format_exc()
        summary["seconds"][p] = round(time.time() - t0, 1)
        (OUT / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        print(p, summary["seconds"][p], "s", file=sys.stderr)
    print(json.dumps(summary, indent=1, default=str))
    return 0 if not summary.get("errors") else 1


if __name__ == "__main__":
    sys.exit(main())
