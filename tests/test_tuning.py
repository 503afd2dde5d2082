"""Launch knobs (kernels/tuning.py): defaults, overrides, and refusals that protect normal runs."""

from pathlib import Path

import pytest
import torch

from kdadbg_kernels.tuning import knob


def test_default_without_override(monkeypatch):
    monkeypatch.delenv("KDADBG_REC_BV", raising=False)
    assert knob("REC_BV", 16) == 16


def test_environment_overrides_the_default(monkeypatch):
    monkeypatch.setenv("KDADBG_REC_BV", "32")
    assert knob("REC_BV", 16) == 32


def test_non_integer_override_names_the_variable(monkeypatch):
    monkeypatch.setenv("KDADBG_REC_BV", "wide")
    with pytest.raises(ValueError, match="KDADBG_REC_BV: expected an integer, found 'wide'"):
        knob("REC_BV", 16)


def test_knob_follows_every_change_to_the_environment(monkeypatch):
    """knob reads os.environ's own mapping (one lookup per knob): each way of changing the environment is
    seen at once, and a mapping-less os.environ falls back to os.environ.get."""
    import os
    from unittest import mock

    monkeypatch.delenv("KDADBG_REC_BV", raising=False)
    seen = [knob("REC_BV", 16)]
    monkeypatch.setenv("KDADBG_REC_BV", "32")
    seen.append(knob("REC_BV", 16))
    os.environ["KDADBG_REC_BV"] = "64"
    seen.append(knob("REC_BV", 16))
    with mock.patch.dict(os.environ, {"KDADBG_REC_BV": "8"}):
        seen.append(knob("REC_BV", 16))
    seen.append(knob("REC_BV", 16))
    del os.environ["KDADBG_REC_BV"]
    seen.append(knob("REC_BV", 16))
    assert seen == [16, 32, 64, 8, 64, 16]

    class PlainEnviron(dict):  # an os.environ without the _data mapping
        pass

    monkeypatch.setattr(os, "environ", PlainEnviron(KDADBG_REC_BV="48"))
    assert knob("REC_BV", 16) == 48
    os.environ["KDADBG_REC_BV"] = "x"
    with pytest.raises(ValueError, match="found 'x'"):
        knob("REC_BV", 16)
    del os.environ["KDADBG_REC_BV"]
    assert knob("REC_BV", 16) == 16


def test_unknown_knob_is_refused():
    with pytest.raises(KeyError, match="REC_BW"):
        knob("REC_BW", 16)


def test_every_knob_the_kernels_read_is_in_the_table_and_every_entry_is_read():
    """One table (tuning.KNOBS) holds every knob with its default and meaning; the kernels read no other
    and the table holds none they do not read."""
    import re

    import kdadbg_kernels
    from kdadbg_kernels.tuning import KNOBS

    read = set()
    for path in Path(kdadbg_kernels.__file__).parent.glob("*.py"):
        read |= set(re.findall(r'(?:knob|state_block_v|pipeline_stages)\(\s*"([A-Z0-9_]+)"', path.read_text()))
    assert read == set(KNOBS)
    assert all(k.default and k.meaning for k in KNOBS.values())
    assert {n for n, k in KNOBS.items() if k.results} >= {"FWD_LOWP", "DQKG_SPLIT", "DQKG_BLOCKED"}


def test_overrides_lists_the_knobs_set(monkeypatch):
    from kdadbg_kernels.tuning import KNOBS, overrides

    for n in KNOBS:
        monkeypatch.delenv(f"KDADBG_{n}", raising=False)
    assert overrides() == {}
    monkeypatch.setenv("KDADBG_REC_BV", "32")
    monkeypatch.setenv("KDADBG_CAPTURE", "{}")  # not a knob
    assert overrides() == {"REC_BV": "32"}


@pytest.mark.parametrize("chains,K,V,per_sm,want", [
    (16, 128, 128, 1, 16),    # H16: 128 programs fill the 132 SMs
    (32, 128, 128, 1, 32),    # H32: 16-column blocks would be 256 programs
    (192, 128, 128, 1, 64),   # six sequences at H32: as few programs as the cap allows
    (32, 128, 128, 2, 16),    # backward: two programs per SM
    (192, 128, 128, 2, 64),
    (400, 256, 256, 1, 32),   # K = 256: the [K, BV] state capped at 8192 elements
    (2, 16, 16, 1, 16),
])
def test_state_block_v_fills_the_sms_without_more_programs(monkeypatch, chains, K, V, per_sm, want):
    from kdadbg_kernels.tuning import state_block_v

    monkeypatch.delenv("KDADBG_REC_BV", raising=False)
    assert state_block_v("REC_BV", chains, K, V, "cpu", per_sm) == want
    monkeypatch.setenv("KDADBG_REC_BV", "16")
    assert state_block_v("REC_BV", chains, K, V, "cpu", per_sm) == 16


def test_chunk_launches_run_the_tap_variant_only_over_the_window():
    from types import SimpleNamespace

    from kdadbg_kernels.common import chunk_launches

    assert chunk_launches(None, 10) == [(0, 10, False)]
    assert chunk_launches(SimpleNamespace(lo=3, hi=3), 10) == [(0, 10, False)]  # empty window
    assert chunk_launches(SimpleNamespace(lo=2, hi=5), 10) == [(0, 2, False), (2, 5, True), (5, 10, False)]
    assert chunk_launches(SimpleNamespace(lo=0, hi=10), 10) == [(0, 10, True)]
    assert chunk_launches(SimpleNamespace(lo=0, hi=4), 10) == [(0, 4, True), (4, 10, False)]


def test_pipeline_stages_drop_to_what_fits_in_shared_memory(monkeypatch):
    """The forward state pass's byte counts at H16 (16 columns: 221184 bytes with three stages) and at
    H32 (32 columns: 245760 > 232448, so two), as the sm_90 compile found them."""
    from kdadbg_kernels.tuning import pipeline_stages

    monkeypatch.delenv("KDADBG_REC_STAGES", raising=False)
    C, BK = 64, 128
    assert pipeline_stages("REC_STAGES", 3, 4 * C * (2 * BK + 16), 4 * 16 * (BK + C), "cpu") == 3
    assert pipeline_stages("REC_STAGES", 3, 4 * C * (2 * BK + 32), 4 * 32 * (BK + C), "cpu") == 2
    assert pipeline_stages("REC_STAGES", 3, 10 ** 6, 0, "cpu") == 1  # never below one stage
    monkeypatch.setenv("KDADBG_REC_STAGES", "4")
    assert pipeline_stages("REC_STAGES", 3, 4 * C * (2 * BK + 32), 4 * 32 * (BK + C), "cpu") == 4


@pytest.mark.parametrize("BV, want", [(16, (3, 0)), (32, (3, 1)), (64, (2, 0))])
def test_state_pass_loads_u_ahead_only_where_it_buys_a_stage(monkeypatch, BV, want):
    """fp32 mode's state pass (fp32 tiles, no fused output): H16 (16 columns) has three stages either way,
    u stays in the stages (loading it ahead cost 0.10 ms there); H32 (32 columns) gets its third stage only
    with u in registers; the varlen batch (64 columns) has two either way (ahead it cost 0.41 ms)."""
    from kdadbg_kernels.recurrence import state_pass_plan

    for name in ("KDADBG_REC_STAGES", "KDADBG_REC_U_AHEAD"):
        monkeypatch.delenv(name, raising=False)
    assert state_pass_plan(64, 128, BV, "cpu") == want
    monkeypatch.setenv("KDADBG_REC_U_AHEAD", "0")
    assert state_pass_plan(64, 128, BV, "cpu")[1] == 0


@pytest.mark.parametrize("BV, want", [(16, (3, 1)), (32, (3, 0)), (64, (2, 0))])
def test_state_pass_stages_in_the_fast_mode(monkeypatch, BV, want):
    """bf16 mode's state pass (w, krT, u and the product operands in bf16, with the fused output's qd
    and Mqk tiles): three stages at 16 and 32 columns, u loaded ahead at 16 alone, two at 64. Compiled for
    sm_90 (triton 3.6) they take 192512 and 204800 bytes at three stages, 155648 at two (64 columns)."""
    from kdadbg_kernels.recurrence import state_pass_plan

    for name in ("KDADBG_REC_STAGES", "KDADBG_REC_U_AHEAD"):
        monkeypatch.delenv(name, raising=False)
    assert state_pass_plan(64, 128, BV, "cpu", (2, 2, 2, 2), 64 * 128 * 2 + 4 * 64 * 64) == want


@pytest.mark.parametrize("BV, want", [(16, (3, 1)), (32, (3, 0)), (64, (2, 0))])
def test_state_pass_plan_of_the_default_bf16_mode(monkeypatch, BV, want):
    """The default bf16 mode (w, krT bf16, u fp32, bf16 products; the fused output's qd and, with
    prepare.mqk_bf16, Mqk tiles in bf16): three stages at 16 and 32 columns, u loaded ahead at 16 (H16
    T16384 forward 1.040 ms with it against 1.058 without; at H32 1.834 against 1.805,
    docs/gpu/round25/call2);
    at 64 columns u ahead would buy a third stage but is not taken (the varlen batch's forward 2.069 with it
    against 1.820 without, at two stages)."""
    from kdadbg_kernels.recurrence import state_pass_plan

    for name in ("KDADBG_REC_STAGES", "KDADBG_REC_U_AHEAD"):
        monkeypatch.delenv(name, raising=False)
    assert state_pass_plan(64, 128, BV, "cpu", (2, 2, 4, 2), 64 * 128 * 2 + 2 * 64 * 64) == want


def test_forward_fast_mode_defaults_and_overrides(monkeypatch):
    """bf16 mode stores w and krT (not u) in bf16 with bf16 products and forms o in the state pass;
    fp32 mode does neither; KDADBG_FWD_LOWP / KDADBG_FWD_FUSE_OUT override, and a bad mask is refused."""
    from kdadbg_kernels.common import fwd_lowp
    from kdadbg_kernels.recurrence import fuse_out

    assert (fwd_lowp("bf16"), fwd_lowp("fp32")) == (11, 0)
    assert (fuse_out("bf16"), fuse_out("fp32")) == (True, False)
    monkeypatch.setenv("KDADBG_FWD_LOWP", "3")
    monkeypatch.setenv("KDADBG_FWD_FUSE_OUT", "0")
    assert (fwd_lowp("bf16"), fwd_lowp("fp32"), fuse_out("bf16")) == (3, 0, False)
    monkeypatch.setenv("KDADBG_FWD_LOWP", "16")
    with pytest.raises(ValueError, match="FWD_LOWP=16"):
        fwd_lowp("bf16")


def test_pick_variants_takes_each_groups_fastest_beyond_the_margin(tmp_path):
    """benchmarks/pick_variants.py: per group of knobs the fastest variant wins only when it beats the
    baseline by more than the margin; a variant whose knobs span two groups belongs to neither."""
    import json
    import subprocess
    import sys

    lines = [("default --H 32", {}, 1.000), ("a", {"KDADBG_PREP_WARPS": "8"}, 0.950),
             ("b", {"KDADBG_PREP_BK": "64"}, 0.940), ("c", {"KDADBG_PREP_WU_WARPS": "8"}, 0.995),
             ("d", {"KDADBG_PREP_BK": "16", "KDADBG_PREP_WU_BK": "32"}, 0.5)]
    f = tmp_path / "stages.jsonl"
    f.write_text("".join(json.dumps({"tag": t, "knobs": k, "ms": {"fwd_prepare": ms}}) + "\n" for t, k, ms in lines))
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "pick_variants.py"
    p = subprocess.run([sys.executable, str(script), str(f), "--groups", "PREP_WARPS,PREP_BK",
                        "PREP_WU_WARPS,PREP_WU_BK"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["KDADBG_PREP_BK=64"]  # c is within 1%, d spans both groups


def test_bench_merge_keeps_the_last_row_of_each_configuration_and_the_rest_beside(tmp_path):
    """benchmarks/bench_merge.py: per setting and shape the row of the last file wins, the row it replaced
    is kept under superseded, taps timings and knob A/B runs are collected with their source, an untimed
    (skipped) row is not a result; a file that is not bench.py's JSON is refused in one line, nothing written."""
    import json
    import subprocess
    import sys

    def row(setting, shape, fwd, **extra):
        return {"name": f"{setting}_{shape}", "setting": setting, "shape": shape, "runs": {"ours": {"fwd_ms": fwd},
                **extra.pop("runs", {})}, "ratios": {}, **extra}

    a = {"schema": 2, "env": {"commit": "aaa"}, "results": [
        row("pregated", "dense_H16_T8192", 1.0), row("softplus", "dense_H16_T8192", 2.0),
        {"name": "x", "setting": "pregated", "shape": "dense_H64_T8192", "runs": {}}]}
    b = {"schema": 2, "env": {"commit": "bbb"}, "results": [
        row("pregated", "dense_H16_T8192", 0.9, taps_ratios=[1.05, 1.06], taps_fwdbwd_ms=[[1, 1.05], [1, 1.06]],
            runs={"ours@REC_BV=32": {"fwd_ms": 1.1, "fwdbwd_ms": 3.0}})]}
    fa, fb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "merged.json"
    fa.write_text(json.dumps(a))
    fb.write_text(json.dumps(b))
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_merge.py"
    p = subprocess.run([sys.executable, str(script), str(fa), str(fb), "--out", str(out), "--note", "n1"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    m = json.loads(out.read_text())
    got = {(r["setting"], r["shape"]): (r["commit"], r["runs"]["ours"]["fwd_ms"]) for r in m["results"]}
    assert got == {("pregated", "dense_H16_T8192"): ("bbb", 0.9), ("softplus", "dense_H16_T8192"): ("aaa", 2.0)}
    assert [(r["commit"], r["runs"]["ours"]["fwd_ms"]) for r in m["superseded"]] == [("aaa", 1.0)]
    assert [t["taps_ratios"] for t in m["taps"]] == [[1.05, 1.06]] and m["taps"][0]["commit"] == "bbb"
    assert m["knob_ab"][0]["ours@REC_BV=32"] == {"fwd_ms": 1.1, "fwdbwd_ms": 3.0}
    assert set(m["sources"]) == {str(fa), str(fb)} and m["notes"] == ["n1"]

    # per peer: a later run against FlashKDA alone keeps the earlier run against fla current beside it, and
    # a run of both earlier still is superseded by the two
    both = {"fla": {"fwd_ms": 1.5}, "flashkda": {"fwd_ms": 1.2}}
    runs = [("c", [row("lower_bound", "dense_H32_T16384", 2.0, runs=both)]),
            ("d", [row("lower_bound", "dense_H32_T16384", 1.9, runs={"fla": {"fwd_ms": 1.6}})]),
            ("e", [row("lower_bound", "dense_H32_T16384", 1.8, runs={"flashkda": {"fwd_ms": 1.1}})])]
    files = []
    for commit, results in runs:
        f = tmp_path / f"{commit}.json"
        f.write_text(json.dumps({"schema": 2, "env": {"commit": commit}, "results": results}))
        files.append(str(f))
    p = subprocess.run([sys.executable, str(script), *files, "--out", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    m = json.loads(out.read_text())
    assert [(r["commit"], sorted(r["runs"])) for r in m["results"]] == [("d", ["fla", "ours"]),
                                                                        ("e", ["flashkda", "ours"])]
    assert [r["commit"] for r in m["superseded"]] == ["c"]

    # --only: of file e, only the H16 rows may be current; its H32 row is superseded, d's stays current
    # against fla and c's against FlashKDA (no other row timed it)
    files[2] = str(tmp_path / "e.json")
    Path(files[2]).write_text(json.dumps({"schema": 2, "env": {"commit": "e"}, "results": [
        row("lower_bound", "dense_H32_T16384", 1.8, runs={"fla": {"fwd_ms": 1.4}}),
        row("lower_bound", "dense_H16_T16384", 0.7, runs={"fla": {"fwd_ms": 0.8}})]}))
    p = subprocess.run([sys.executable, str(script), *files, "--out", str(out), "--only",
                        f"{files[2]}=dense_H16_T16384"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    m = json.loads(out.read_text())
    assert [(r["commit"], r["shape"]) for r in m["results"]] == [("c", "dense_H32_T16384"), ("d", "dense_H32_T16384"),
                                                                 ("e", "dense_H16_T16384")]
    assert [(r["commit"], r["shape"]) for r in m["superseded"]] == [("e", "dense_H32_T16384")]
    for wrong in (f"{files[2]}=dense_H64_T8192", "nofile.json=dense_H16_T16384", files[2]):
        p = subprocess.run([sys.executable, str(script), *files, "--out", str(out), "--only", wrong],
                           capture_output=True, text=True)
        assert p.returncode != 0 and p.stderr.strip().count("\n") == 0 and "--only" in p.stderr, wrong

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": 1}))
    out.unlink()
    p = subprocess.run([sys.executable, str(script), str(fa), str(bad), "--out", str(out)], capture_output=True,
                       text=True)
    assert p.returncode != 0 and not out.exists()
    assert p.stderr.strip().count("\n") == 0 and str(bad) in p.stderr and "schema 1" in p.stderr


def test_bench_table_bolds_the_targets_met_and_takes_the_better_inference_chunk(tmp_path):
    """benchmarks/bench_table.py: one row per configuration with its commit, a ratio bold where issue 23's
    target is met (forward <= 0.9, forward + backward <= 0.85, FlashKDA <= 0.9), the inference forward at
    the better chunk, the latest taps timing, --commits filtering, and a one-line refusal of a file that is
    not bench.py's JSON or holds no row of the commits asked for."""
    import json
    import subprocess
    import sys

    ours = {"fwd_ms": 1.0, "fwdbwd_ms": 4.0, "peak_mem_gib": 2.5}
    data = {"schema": 2, "results": [
        {"name": "softplus_dense_H16_T16384", "setting": "softplus", "shape": "dense_H16_T16384", "commit": "aaa",
         "runs": {"ours": ours, "fla": {"fwd_ms": 1.2, "fwdbwd_ms": 4.4, "peak_mem_gib": 2.2}},
         "ratios": {"ours/fla_fwd": 1.0 / 1.2, "ours/fla_fwdbwd": 4.0 / 4.4}},
        {"name": "lower_bound_dense_H64_T8192", "setting": "lower_bound", "shape": "dense_H64_T8192", "commit": "bbb",
         "runs": {"ours": ours, "flashkda": {"fwd_ms": 1.25, "peak_mem_gib": 1.2},
                  "ours_infer": {"fwd_ms": 1.8, "peak_mem_gib": 2.0}, "ours_infer_c16": {"fwd_ms": 1.6, "peak_mem_gib": 1.9}},
         "ratios": {"ours/flashkda_fwd": 0.8, "ours_infer/flashkda_fwd": 1.28}}],
        "taps": [{"name": "lower_bound_dense_H32_T16384", "commit": "aaa", "taps_ratios": [1.2, 1.2, 1.2]},
                 {"name": "lower_bound_dense_H32_T16384", "commit": "bbb", "taps_ratios": [1.097, 1.096, 1.1]}]}
    f = tmp_path / "b.json"
    f.write_text(json.dumps(data))
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_table.py"
    p = subprocess.run([sys.executable, str(script), str(f)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "| softplus, H16 T16384 | 1.000 | 1.200 | **0.833** | 4.000 | 4.400 | 0.909 | 2.50 / 2.20 | aaa |" in lines
    assert "| H64 T8192 | 1.000 | 1.600 (16) | 1.250 | **0.800** | 1.280 | 2.50 / 1.90 / 1.20 | bbb |" in lines
    assert "| lower_bound, H32 T16384 | 1.097 / 1.096 / 1.100 | bbb |" in lines and "1.200 / 1.200" not in p.stdout
    p = subprocess.run([sys.executable, str(script), str(f), "--commits", "aaa"], capture_output=True, text=True)
    assert p.returncode == 0 and "softplus, H16" in p.stdout and "H64 T8192" not in p.stdout
    assert "1.200 / 1.200 / 1.200 | aaa" in p.stdout
    # a later row timing fla at the same configuration replaces it, also under --commits of the earlier one
    data["results"].append(dict(data["results"][0], commit="ccc"))
    f.write_text(json.dumps(data))
    p = subprocess.run([sys.executable, str(script), str(f)], capture_output=True, text=True)
    assert [x.split(" | ")[-1] for x in p.stdout.splitlines() if x.startswith("| softplus")] == ["ccc |"]
    p = subprocess.run([sys.executable, str(script), str(f), "--commits", "aaa"], capture_output=True, text=True)
    assert p.returncode == 0 and "| softplus" not in p.stdout
    for args, said in (([str(f), "--commits", "zzz"], "no rows of commits zzz"),
                       ([str(tmp_path / "none.json")], "cannot read")):
        p = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
        assert p.returncode != 0 and p.stderr.strip().count("\n") == 0 and said in p.stderr
        assert p.stderr.startswith("bench_table: ")


def test_a_row_timed_under_knob_overrides_says_so_in_the_merged_file_and_the_table(tmp_path):
    """bench_merge.py keeps the KDADBG_* overrides a run was timed under (its env) as the row's and its taps'
    ``knobs``; bench_table.py prints them beside the commit, and ``--commits`` matches a full commit by its
    abbreviation (bench.py records the full one)."""
    import json
    import subprocess
    import sys

    full = "c547650bdd35686f16ea35c50eb8655084731267"
    run = {"schema": 2, "env": {"commit": full, "env": {"KDADBG_EXP_FTZ": "1", "FLA_FLASH_KDA": "0"}}, "results": [
        {"name": "lower_bound_dense_H32_T16384", "setting": "lower_bound", "shape": "dense_H32_T16384",
         "runs": {"ours": {"fwd_ms": 1.85, "fwdbwd_ms": 7.72}, "fla": {"fwd_ms": 1.86, "fwdbwd_ms": 8.84}},
         "ratios": {"ours/fla_fwd": 1.85 / 1.86, "ours/fla_fwdbwd": 7.72 / 8.84}, "taps_ratios": [1.11, 1.11, 1.11]}]}
    plain = {"schema": 2, "env": {"commit": "aaaaaaa"}, "results": [dict(run["results"][0], shape="dense_H16_T8192",
                                                                         name="lower_bound_dense_H16_T8192")]}
    fa, fb, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "m.json"
    fa.write_text(json.dumps(run))
    fb.write_text(json.dumps(plain))
    root = Path(__file__).resolve().parents[1] / "benchmarks"
    p = subprocess.run([sys.executable, str(root / "bench_merge.py"), str(fa), str(fb), "--out", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    m = json.loads(out.read_text())
    assert [r.get("knobs") for r in m["results"]] == [{"EXP_FTZ": "1"}, None]
    assert m["taps"][0]["knobs"] == {"EXP_FTZ": "1"} and "knobs" not in m["taps"][1]
    for f in (out, fa):  # the merged file and the bench.py file itself
        p = subprocess.run([sys.executable, str(root / "bench_table.py"), str(f), "--commits", "c547650"],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert "| lower_bound, H32 T16384 | 1.850 | 1.860 | " in p.stdout and "| c547650 EXP_FTZ=1 |" in p.stdout
        assert "H16 T8192" not in p.stdout and "| 1.110 / 1.110 / 1.110 | c547650 EXP_FTZ=1 |" in p.stdout
    p = subprocess.run([sys.executable, str(root / "bench_table.py"), str(out)], capture_output=True, text=True)
    assert "| lower_bound, H16 T8192 | " in p.stdout and p.stdout.count("| aaaaaaa |") == 2  # no knobs: the commit


def test_bench_table_lists_where_fla_moved_and_ours_against_its_fastest_timing(tmp_path):
    """bench_table.py's fourth table: a configuration whose fla timings (current and superseded rows) differ
    by more than 5 % is listed with fla's fastest and slowest timing and ours against the fastest; one whose
    fla stayed within 5 % is not listed, nor is the table when no configuration moved."""
    import json
    import subprocess
    import sys

    def row(setting, commit, fla_fwd, fla_fb, ours_fwd=1.0, ours_fb=4.0):
        return {"name": f"{setting}_dense_H16_T8192", "setting": setting, "shape": "dense_H16_T8192",
                "commit": commit, "runs": {"ours": {"fwd_ms": ours_fwd, "fwdbwd_ms": ours_fb},
                                           "fla": {"fwd_ms": fla_fwd, "fwdbwd_ms": fla_fb}},
                "ratios": {"ours/fla_fwd": ours_fwd / fla_fwd, "ours/fla_fwdbwd": ours_fb / fla_fb}}

    data = {"schema": 2, "results": [row("softplus", "new", 2.0, 5.0), row("pregated", "new", 1.2, 4.4)],
            "superseded": [row("softplus", "old", 1.05, 4.9, 0.9, 3.0), row("pregated", "old", 1.19, 4.41)]}
    f = tmp_path / "b.json"
    f.write_text(json.dumps(data))
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_table.py"
    p = subprocess.run([sys.executable, str(script), str(f)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    line = "| softplus, H16 T8192 | 1.050 - 2.000 (2) | 0.952 | 4.900 - 5.000 (2) | **0.816** | new |"
    assert line in p.stdout.splitlines()
    assert "fla's own time moved" in p.stdout and "| pregated, H16 T8192 | 1.190" not in p.stdout
    data["superseded"] = data["superseded"][1:]
    f.write_text(json.dumps(data))
    p = subprocess.run([sys.executable, str(script), str(f)], capture_output=True, text=True)
    assert p.returncode == 0 and "moved" not in p.stdout and "| softplus, H16 T8192 | 1.000 | 2.000 |" in p.stdout


def test_bench_ratios_keep_the_inference_forward_to_flashkda_alone():
    """benchmarks/bench.py: ours and its knob variants against fla (forward, forward + backward), our best
    training forward (chunk sizes included) against FlashKDA's forward, and ours_infer (the forward under
    no_grad, its best chunk; its knob variants timed, not in the ratio) against FlashKDA's forward only:
    never against fla's training forward. --dry-run lists it at both chunks and at the variant."""
    import subprocess
    import sys

    bench_dir = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, bench_dir)
    try:
        import bench
    finally:
        sys.path.remove(bench_dir)
    rec = {"runs": {"ours": {"fwd_ms": 2.0, "fwdbwd_ms": 8.0}, "ours@REC_BV=32": {"fwd_ms": 2.2, "fwdbwd_ms": 8.8},
                    "ours_c16": {"fwd_ms": 1.8}, "ours_infer": {"fwd_ms": 1.5}, "ours_infer_c16": {"fwd_ms": 1.4},
                    "ours_infer@INFER_ROWSCALE=0": {"fwd_ms": 1.3}, "ours_infer_c16@INFER_ROWSCALE=0": {"fwd_ms": 1.2},
                    "fla": {"fwd_ms": 2.5, "fwdbwd_ms": 10.0}, "flashkda": {"fwd_ms": 1.0}}}
    bench.ratios(rec)
    assert rec["ratios"] == pytest.approx({"ours/fla_fwd": 0.8, "ours/fla_fwdbwd": 0.8, "ours/flashkda_fwd": 1.8,
                                           "ours@REC_BV=32/fla_fwd": 0.88, "ours@REC_BV=32/fla_fwdbwd": 0.88,
                                           "ours@REC_BV=32/flashkda_fwd": 2.2, "ours_infer/flashkda_fwd": 1.4})
    p = subprocess.run([sys.executable, str(Path(bench_dir) / "bench.py"), "--dry-run", "--peers", "fla,flashkda",
                        "--shapes", "dense_H16_T8192", "--ab", "KDADBG_INFER_ROWSCALE=0"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rows = {line.split()[0]: line for line in p.stdout.splitlines() if line.startswith(("pregated", "lower"))}
    assert "ours_infer" in rows["lower_bound_dense_H16_T8192"] and "ours_infer" not in rows["pregated_dense_H16_T8192"]
    assert "ours_infer_c16" in rows["lower_bound_dense_H16_T8192"]
    assert "ours_infer@INFER_ROWSCALE=0" in rows["lower_bound_dense_H16_T8192"]
    assert "ours_infer_c16@INFER_ROWSCALE=0" in rows["lower_bound_dense_H16_T8192"]


def test_kernel_profile_reports_a_failing_variant_and_times_the_others(tmp_path):
    """benchmarks/kernel_profile.py: a knob variant that fails (here a FWD_LOWP mask it refuses; on the GPU,
    one out of shared memory) is reported on one line and in the JSON's ``failed``, the baseline is still
    timed, and the exit status is 1. Before, the first failure ended the whole run."""
    import json
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_profile.py"
    out = tmp_path / "p.json"
    p = subprocess.run([sys.executable, str(script), "--H", "1", "--T", "64", "--D", "16", "--chunk-size", "16",
                        "--iters", "1", "--device", "cpu", "--ab", "KDADBG_FWD_LOWP=16", "--json", str(out)],
                       capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=600)
    assert p.returncode == 1, p.stderr[-2000:]
    assert "ours [pregated FWD_LOWP=16]: failed, not timed: KnobError: KDADBG_FWD_LOWP=16" in p.stdout
    d = json.loads(out.read_text())
    assert [x["tag"] for x in d["profiles"]] == ["pregated"] and d["profiles"][0]["wall_ms"]["fwdbwd"] > 0
    assert [x["tag"] for x in d["failed"]] == ["pregated FWD_LOWP=16"]


def test_bench_cpu_smoke_times_ours_without_the_interpreter_in_the_environment(tmp_path):
    """benchmarks/bench.py --device cpu with TRITON_INTERPRET unset turns the interpreter on before Triton is
    imported (before, the run was recorded as Triton's "0 active drivers" error) and times our forward and
    forward + backward."""
    import json
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"
    out = tmp_path / "b.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, str(script), "--device", "cpu", "--settings", "pregated", "--shapes",
                        "dense_H1_T64", "--peers", "none", "--dim", "16", "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    (row,) = json.loads(out.read_text())["results"]
    ours = row["runs"]["ours"]
    assert "error" not in ours and ours["fwd_ms"] > 0 and ours["fwdbwd_ms"] > 0, ours


def test_kernel_profile_cpu_smoke_sets_the_interpreter_and_reports_no_kernel_time():
    """benchmarks/kernel_profile.py --device cpu without TRITON_INTERPRET in the environment: it turns the
    interpreter on itself (before, Triton found no driver and the run ended in a traceback), and, having no
    CUDA times, says so instead of printing kernel times or totals of 0."""
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_profile.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, str(script), "--H", "1", "--T", "64", "--D", "16", "--chunk-size", "16",
                        "--iters", "1", "--device", "cpu", "--settings", "pregated,lower_bound"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    heads = [x for x in lines if x.startswith("ours [")]
    assert len(heads) == 2 and all("no kernel time (a CPU smoke test" in x for x in heads)
    assert not any(x.startswith("total ") for x in lines) and "kernel time per fwd" not in p.stdout
    assert sum(x.startswith("wall (do_bench median)") for x in lines) == 2


@pytest.mark.parametrize("V, H, N, C, e, want", [
    (128, 32, 1, 64, 2, 2),   # dense H32: 256 programs of 16 columns, two fit in an SM at 2 stages, not at 3
    (128, 64, 1, 64, 2, 2),   # dense H64: 512 programs
    (128, 16, 1, 64, 2, 3),   # dense H16: 128 programs, one per SM
    (128, 32, 6, 64, 2, 3),   # the six-sequence varlen batch: 32 columns, two programs do not fit at 2
    (128, 32, 1, 16, 2, 3),   # chunk 16: two fit at 3 stages already
    (128, 32, 1, 32, 2, 3),   # chunk 32: likewise
    (128, 32, 1, 64, 4, 2),   # fp32 mode: two never fit; 3 stages do not fit one program, 2 do
])
def test_backward_state_pass_takes_two_stages_where_two_programs_share_an_sm(monkeypatch, V, H, N, C, e, want):
    """recurrence_bwd's stages (K = 128, ``e`` bytes per operand element: 2 in bf16 mode, 4 in fp32 mode; an
    H200's 132 SMs and 233472 bytes per SM off the GPU): tuning.stages_for_residency with the pass's own
    shared-memory sizes and V block, then pipeline_stages, and RECB_STAGES over it."""
    from kdadbg_kernels.recurrence_bwd import bwd_state_stages
    from kdadbg_kernels.tuning import state_block_v

    for name in ("KDADBG_RECB_BV", "KDADBG_RECB_STAGES"):
        monkeypatch.delenv(name, raising=False)
    BV = state_block_v("RECB_BV", N * H, 128, V, "cpu", per_sm=6)
    assert BV == (32 if N == 6 else 16)
    assert bwd_state_stages(N * H, 128, V, C, BV, e, e, "cpu") == want
    monkeypatch.setenv("KDADBG_RECB_STAGES", "4")
    assert bwd_state_stages(N * H, 128, V, C, BV, e, e, "cpu") == 4


def test_overlap_probe_runs_every_stage_on_the_cpu():
    """benchmarks/overlap_probe.py --device cpu: the forward's prepare and state pass and the backward's state,
    V and K passes run under the interpreter for each setting, with the gate our kernels take from fla's flags
    (kdadbg.capturing.call_config), and it says that nothing was timed rather than printing times."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "overlap_probe.py"
    p = subprocess.run([sys.executable, str(script), "--device", "cpu", "--H", "1", "--T", "64", "--settings",
                        "lower_bound,softplus,pregated"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    for setting, gate in (("lower_bound", "lower_bound"), ("softplus", "softplus"), ("pregated", "none")):
        assert f"{setting}: H1 T64, gate {gate}" in lines
    assert sum("nothing timed" in x for x in lines) == 6 and " ms" not in p.stdout


NEEDS_CUDA = [  # (script and arguments, whether it offers a CPU run in its line)
    ("kernel_profile.py --H 1 --T 64", True), ("bench.py --shapes dense_H1_T64 --peers none", True),
    ("overlap_probe.py --H 1 --T 64", True), ("accuracy_ab.py --T 64 --H 1", True),
    ("dg_probe.py kimi 1:0 --size 64,1,16", True), ("realistic_diag.py kimi:fp32 --out x.json --small", True),
    ("reference_cpu.py --T 64 --H 1 --device cuda", True), ("bf16_margin.py --device cuda --cases kimi", True),
    ("gpu_fla.py", True), ("gpu_judge_dumps.py d l s", True), ("stage_bench.py --H 1 --T 64", False),
    ("ncu_step.py", False), ("fla_model_step.py", False)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA GPU")
@pytest.mark.parametrize("command, cpu", NEEDS_CUDA, ids=[c.split()[0] for c, _ in NEEDS_CUDA])
def test_gpu_scripts_say_in_one_line_that_they_need_a_gpu(tmp_path, command, cpu):
    """On a machine without a CUDA GPU each benchmark script that needs one exits 2 with one line on stderr
    that names the script and, where it has one, its CPU run, instead of torch's traceback at its first CUDA
    tensor; nothing is written."""
    import os
    import subprocess
    import sys

    script, *args = command.split()
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KDADBG_JUDGE_DEVICE")}
    p = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "benchmarks" / script), *args],
                       capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
    assert lines[0].startswith(f"{script}: needs a CUDA GPU, and torch ") and ("; or " in lines[0]) == cpu
    assert list(tmp_path.iterdir()) == []


def test_bench_taps_at_outside_the_timed_configurations_is_refused_not_dropped():
    """benchmarks/bench.py: a --taps-at pair whose setting or shape is not timed was once left out without a
    word; now it is refused in one line (exit 2), and the default pairs follow --settings and --shapes."""
    import subprocess
    import sys
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"

    def dry(*args):
        return subprocess.run([sys.executable, str(script), "--dry-run", *args], capture_output=True, text=True)

    r = dry("--settings", "pregated", "--shapes", "dense_H16_T8192", "--taps-at", "lower_bound:dense_H32_T16384")
    assert r.returncode == 2 and "--taps-at lower_bound:dense_H32_T16384: not among the configurations" in r.stderr
    r = dry("--settings", "lower_bound", "--shapes", "dense_H32_T16384", "--taps-at", "lower_bound:dense_H32_T16384")
    assert r.returncode == 0 and "lower_bound_dense_H32_T16384" in r.stdout and "taps x3" in r.stdout
    r = dry("--settings", "pregated,lower_bound", "--shapes", "dense_H16_T8192")  # no default pair timed here
    assert r.returncode == 0 and "taps" not in r.stdout, r.stdout
    r = dry("--settings", "pregated", "--shapes", "dense_H16_T16384")  # the default pair that is
    assert r.returncode == 0 and "taps x3" in r.stdout


def test_record_reads_and_variant_effect_say_when_a_variant_repeats_the_defaults(monkeypatch):
    """tuning.record_reads collects the value each knob read inside it returned (override or default), and
    nothing outside it; peer_inputs.variant_effect says why a --ab variant cannot differ from the run it is
    timed beside: every knob it sets read that value there, or was not read at all. A variant that changes
    one knob read otherwise, or a value the knob refuses, is left to run."""
    import sys

    from kdadbg_kernels.tuning import knob, record_reads

    bench_dir = str(Path(__file__).resolve().parents[1] / "benchmarks")
    sys.path.insert(0, bench_dir)
    try:
        from peer_inputs import variant_effect
    finally:
        sys.path.remove(bench_dir)
    monkeypatch.delenv("KDADBG_S_BF16", raising=False)
    monkeypatch.setenv("KDADBG_REC_BV", "32")
    knob("MQK_BF16", 1)   # outside: not recorded
    with record_reads() as reads:
        assert knob("S_BF16", 1) == 1 and knob("REC_BV", 64) == 32 and knob("REC_BV", 64) == 32
    knob("UDU_BF16", 1)
    assert reads == {"S_BF16": {1}, "REC_BV": {32}}
    assert variant_effect({"KDADBG_S_BF16": "1"}, reads) == \
        "S_BF16=1 is what the defaults read here: this variant repeats the defaults"
    assert variant_effect({"KDADBG_INFER_ROWSCALE": "0", "KDADBG_REC_BV": "32"}, reads) == \
        "REC_BV=32 is what the defaults read here; INFER_ROWSCALE is not read here: this variant repeats the defaults"
    assert variant_effect({"KDADBG_S_BF16": "0"}, reads) is None
    assert variant_effect({"KDADBG_S_BF16": "1", "KDADBG_REC_BV": "16"}, reads) is None
    assert variant_effect({"KDADBG_S_BF16": "x"}, reads) is None


def test_kernel_profile_and_bench_do_not_time_a_variant_that_repeats_the_defaults(tmp_path):
    """benchmarks/kernel_profile.py and bench.py with --ab: a variant whose knobs the defaults already read
    with those values (S_BF16=1 in bf16 mode), or never read (INFER_ROWSCALE in a training call), is said on
    one line and not timed (kernel_profile's JSON ``repeats_defaults``, bench's run ``skipped``); a variant that
    changes a knob read (S_BF16=0) is timed."""
    import json
    import os
    import subprocess
    import sys

    bench_dir = Path(__file__).resolve().parents[1] / "benchmarks"
    out = tmp_path / "p.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, str(bench_dir / "kernel_profile.py"), "--H", "1", "--T", "64", "--D", "16",
                        "--chunk-size", "16", "--iters", "1", "--device", "cpu", "--ab", "KDADBG_S_BF16=1",
                        "--ab", "KDADBG_INFER_ROWSCALE=0", "--ab", "KDADBG_S_BF16=0", "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "ours [pregated S_BF16=1]: not timed: S_BF16=1 is what the defaults read here" in p.stdout
    assert "ours [pregated INFER_ROWSCALE=0]: not timed: INFER_ROWSCALE is not read here" in p.stdout
    d = json.loads(out.read_text())
    assert [x["tag"] for x in d["profiles"]] == ["pregated", "pregated S_BF16=0"]
    assert [x["tag"] for x in d["repeats_defaults"]] == ["pregated S_BF16=1", "pregated INFER_ROWSCALE=0"]
    out = tmp_path / "b.json"
    p = subprocess.run([sys.executable, str(bench_dir / "bench.py"), "--device", "cpu", "--settings", "pregated",
                        "--ab-settings", "pregated", "--shapes", "dense_H1_T64", "--peers", "none", "--dim", "16",
                        "--ab", "KDADBG_INFER_ROWSCALE=0", "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    (row,) = json.loads(out.read_text())["results"]
    assert row["runs"]["ours"]["fwd_ms"] > 0
    assert row["runs"]["ours@INFER_ROWSCALE=0"] == {
        "skipped": "INFER_ROWSCALE is not read here: this variant repeats the defaults"}
    assert "ours@INFER_ROWSCALE=0: not timed: INFER_ROWSCALE is not read here" in p.stdout
