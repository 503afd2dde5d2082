"""``benchmarks/bf16_margin.py``: bf16 mode's error ratio / tolerance per output over seeds (here on the
CPU under the interpreter, as the script runs there)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_margin_rows_cover_every_output_and_bound_the_mean(tmp_path):
    out = tmp_path / "m.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("KDADBG_DQKG_SPLIT", None)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bf16_margin.py"), "--cases", "basic",
                           "--chunk-size", "16", "--seeds", "0", "1", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["rows"]
    keys = {r["key"] for r in rows}
    assert keys == {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias"}
    for r in rows:
        assert r["case"] == "basic" and r["worst_seed"] in (0, 1)
        # basic passes fla's bars in bf16 mode (tests/test_kernels_bwd.py): finite margins under 1
        assert 0 <= r["mean"] <= r["worst"] < 1, r
        assert r["worst"] > 0.05, r  # bf16 rounding shows in every output (0.13 to 0.51 of the bar here)
    assert "0 of 10 (case, output) pairs miss their bar" in proc.stdout


def test_unknown_case_is_named(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bf16_margin.py"), "--cases", "nope"],
                          capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert proc.returncode != 0 and "unknown ['nope']" in proc.stderr
