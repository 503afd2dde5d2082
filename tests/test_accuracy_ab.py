"""``benchmarks/accuracy_ab.py``: error ratios of every output against the float64 reference, one
variant per process (here on the CPU under the interpreter, with a small case)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(tmp_path, *args, chunk=16, **env):
    out = tmp_path / "acc.jsonl"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "accuracy_ab.py"), "--T", "70", "--H", "1",
                           "--K", "16", "--V", "16", "--chunk-size", str(chunk), "--device", "cpu",
                           "--json-lines", str(out), *args],
                          capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "1", **env},
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, [json.loads(line) for line in out.read_text().splitlines()]


def test_ratios_of_every_output_in_both_modes(tmp_path):
    _, (fp32,) = run(tmp_path, "--tag", "a")
    stdout, (fp32_again, bf16) = run(tmp_path, "--tag", "b", "--precision", "bf16")
    assert fp32["tag"] == "a" and bf16["tag"] == "b"  # appended, not overwritten
    assert set(fp32["ratios"]) == {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias"}
    for key, r in fp32["ratios"].items():
        assert 0 < r < fp32["tolerances"][key], (key, r)           # fp32 mode meets its bars, not exactly
        assert r < bf16["ratios"][key] < bf16["tolerances"][key], (key, r)  # bf16 rounding shows
    assert "ddt_bias=" in stdout and "kernels" in stdout


def test_a_knob_reaches_the_kernels(tmp_path):
    """KDADBG_ knobs select a variant: at chunk 64 the K pass's block products in fp32 mode change the
    ratios' last digits (the variant A/B this script exists for)."""
    _, (plain,) = run(tmp_path, "--tag", "plain", chunk=64)
    _, (_, blocked) = run(tmp_path, "--tag", "blocked", chunk=64, KDADBG_DQKG_BLOCKED="1")
    assert blocked["ratios"]["o"] == plain["ratios"]["o"]  # the forward is untouched
    assert blocked["ratios"]["dg"] != plain["ratios"]["dg"]


def test_the_cpu_run_needs_no_interpreter_in_the_environment(tmp_path):
    """--device cpu with TRITON_INTERPRET unset: the kernels are imported under the interpreter all the same
    (before, the script imported Triton first, through kernel_resources' parser, and then Triton's own
    functions could not run inside the interpreted kernels: an InterpreterError)."""
    out = tmp_path / "acc.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "accuracy_ab.py"), "--T", "40", "--H", "1",
                           "--K", "16", "--V", "16", "--chunk-size", "16", "--device", "cpu", "--json-lines",
                           str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(0 < r < row["tolerances"][k] for k, r in row["ratios"].items()) and len(row["ratios"]) == 10
