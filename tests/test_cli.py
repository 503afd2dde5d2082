"""The command line, through typer's CliRunner against fixture files written to tmp_path."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from conftest import GOLDEN, HAS_GPU, REPO
from kdadbg import cli
from kdadbg.cases import CASE_NAMES, get_case, make_inputs
from kdadbg.dump import load_dump
from kdadbg.reference import run_reference
from kdadbg.schema import INSPECT_JSON
from kdadbg.tapsfile import read_taps_file
from kdadbg_kernels.taps import TAP_NAMES
from test_dump import MALFORMED, write_malformed

runner = CliRunner()


def kdadbg(*args):
    return runner.invoke(cli.app, [str(a) for a in args])


def assert_one_error_line(result, *fragments, code=2):
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for frag in fragments:
        assert frag in lines[0], lines[0]
    assert "Traceback" not in result.output


@pytest.fixture
def basic(tmp_path):
    """B=2, T=40 (chunks of 16, 16, 8 per row), H=2, K=V=16, lower_bound gate, h0 and dht."""
    path = tmp_path / "basic.safetensors"
    assert kdadbg("gen", path).exit_code == 0
    return path


def test_version():
    from importlib.metadata import version
    r = kdadbg("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"kdadbg {version('kdadbg')}", r.stdout
    assert "--version" in kdadbg("--help").stdout


def test_gen_list_shows_every_preset():
    r = kdadbg("gen", "--list")
    assert r.exit_code == 0
    listed = {line.split("│")[1].strip() for line in r.stdout.splitlines() if line.startswith("│")}
    assert listed - {""} == set(CASE_NAMES)   # "": a note wrapped onto a second line


def test_gen_writes_the_case(tmp_path):
    path = tmp_path / "v.safetensors"
    r = kdadbg("gen", path, "--preset", "varlen_short", "--seed", "5")
    assert r.exit_code == 0 and str(path) in r.stdout
    got, cfg = load_dump(path)
    want, want_cfg = make_inputs(get_case("varlen_short"), seed=5)
    assert torch.equal(got.q, want.q) and torch.equal(got.cu_seqlens, want.cu_seqlens) and cfg == want_cfg


def test_gen_sizes(tmp_path):
    path = tmp_path / "s.safetensors"
    r = kdadbg("gen", path, "--B", 1, "--T", 33, "--H", 1, "--K", 32, "--V", 8, "--dtype", "bfloat16")
    assert r.exit_code == 0, r.output
    inputs, _ = load_dump(path)
    assert inputs.shape == (1, 33, 1, 32, 8) and inputs.q.dtype == torch.bfloat16
    short = tmp_path / "short.safetensors"   # --precision's spelling names the same dtype (user trial, round 45)
    assert kdadbg("gen", short, "--T", 8, "--dtype", "bf16").exit_code == 0
    assert load_dump(short)[0].q.dtype == torch.bfloat16


def test_gen_refuses_overwrite_without_force(tmp_path, basic):
    before = basic.read_bytes()
    r = kdadbg("gen", basic, "--seed", 9)
    assert_one_error_line(r, str(basic), "already exists")
    assert basic.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["basic.safetensors"]
    assert kdadbg("gen", basic, "--seed", 9, "--force").exit_code == 0
    assert basic.read_bytes() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["basic.safetensors"]


@pytest.mark.parametrize("args, fragment", [
    pytest.param(["--preset", "nope"], "unknown preset 'nope'", id="unknown-preset"),
    pytest.param(["--preset", "varlen", "--T", "10"], "cu_seqlens", id="varlen-resize"),
    pytest.param(["--dtype", "int8"], "--dtype", id="bad-dtype"),
    pytest.param(["--K", "0"], "--K", id="zero-size"),
])
def test_gen_bad_options(tmp_path, args, fragment):
    path = tmp_path / "x.safetensors"
    assert_one_error_line(kdadbg("gen", path, *args), fragment)
    assert not path.exists()


def test_gen_without_out_is_a_usage_error():
    assert_one_error_line(kdadbg("gen"), "gen: missing argument OUT")


@pytest.mark.parametrize("args, line", [
    pytest.param(["run"], "error: run: missing argument DUMP (python -m kdadbg run --help)", id="missing-argument"),
    pytest.param(["run", "x.safetensors", "--precision", "fp16"],
                 "error: run --precision: expected fp32 or bf16, found 'fp16'", id="bad-choice"),
    pytest.param(["run", "x.safetensors", "--bogus"], "error: run: no such option --bogus (python -m kdadbg run --help)",
                 id="unknown-option"),
    # click offered "--json or --precision" for this one (user trial, round 46): the close match only
    pytest.param(["run", "x.safetensors", "--precison", "bf16"],
                 "error: run: no such option --precison; did you mean --precision? (python -m kdadbg run --help)",
                 id="near-miss-option"),
])
def test_usage_errors_are_one_line_through_the_entry_point(args, line):
    """User trial: usage errors were click's boxes ("Usage: ... Try ... ╭─ Error ─╮"); the README promises one
    `error:` line and exit 2. --help and a bare `kdadbg` still print the help."""
    r = subprocess.run([sys.executable, "-m", "kdadbg", *args], capture_output=True, text=True, cwd=REPO)
    assert (r.returncode, r.stderr.strip(), r.stdout) == (2, line, "")
    r = subprocess.run([sys.executable, "-m", "kdadbg", args[0], "--help"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and "Usage: python -m kdadbg run [OPTIONS] DUMP" in r.stdout and r.stderr == ""
    r = subprocess.run([sys.executable, "-m", "kdadbg"], capture_output=True, text=True, cwd=REPO)
    assert "Usage: python -m kdadbg [OPTIONS] COMMAND" in r.stdout and "error" not in r.stdout + r.stderr


def test_inspect_valid(basic):
    r = kdadbg("inspect", basic)
    assert r.exit_code == 0, r.output
    out = r.stdout
    for row in ("q ", "[2,40,2,16]", "h0", "[2,2,16,16]", "dt_bias", "[2,16]", "float32"):
        assert row in out
    assert "verdict: valid" in out and "n_chunks=6" in out
    assert r.stderr == ""
    d = json.loads(kdadbg("inspect", basic, "--json").stdout)
    assert (d["verdict"], d["ok"]) == ("valid", True)   # the word the table prints (the JSON said "ok")


def test_inspect_json_marks_defaults(tmp_path):
    path = tmp_path / "d.safetensors"
    inputs, _ = make_inputs(get_case("gate_none"))
    from safetensors.torch import save_file
    save_file({**dict(inputs.items()), "my_note": torch.ones(2)}, str(path), metadata={"chunk_size": "32"})
    r = kdadbg("inspect", path, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    cfg = {row["key"]: row for row in d["config"]}
    assert cfg["chunk_size"] == {"key": "chunk_size", "value": 32, "default": False}
    assert cfg["gate"] == {"key": "gate", "value": "none", "default": True}
    assert d["extra"] == ["my_note"] and d["ok"] and d["schema"] == INSPECT_JSON
    help_ = runner.invoke(cli.app, ["inspect", "--help"]).stdout
    assert f"JSON (schema {INSPECT_JSON})" in re.sub(r"[\s│]+", " ", help_)


@pytest.mark.parametrize("base, mutate, fragments, overrides",
                         [p for p in MALFORMED if p.values[3] is None])
def test_inspect_malformed(tmp_path, base, mutate, fragments, overrides):
    path = write_malformed(tmp_path, base, mutate)
    r = kdadbg("inspect", path)
    assert_one_error_line(r, f"error: {path}: ", *fragments)
    assert "verdict: invalid" in r.stdout
    rows = {line.split("│")[1].strip() for line in r.stdout.splitlines() if line.startswith("│")}
    with safe_open(str(path), "pt") as f:
        assert set(f.keys()) <= rows  # the tensors of an invalid dump are still listed


def test_inspect_describes_nonfinite_inputs(tmp_path, basic):
    """User trial, round 42: inspect on a dump capture --when nonfinite wrote said "invalid: ... expected finite
    values" (exit 2) and refused --allow-nonfinite. It describes the NaN/Inf (counts, first index, token, head,
    chunk), says run/diff need --allow-nonfinite, exits 0, and accepts the option as run and diff do."""
    from safetensors.torch import load_file, save_file

    with safe_open(str(basic), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(basic))
    tensors["q"][1, 5, 1, 3], tensors["q"][1, 7, 0, 0] = float("nan"), float("inf")
    path = tmp_path / "nf.safetensors"
    save_file(tensors, str(path), metadata=meta)
    for extra in ((), ("--allow-nonfinite",)):
        r = kdadbg("inspect", path, *extra)
        assert r.exit_code == 0 and r.stderr == "", r.output
        assert "q: 1 NaN, 1 Inf; first at [1,5,1,3] (batch 1, token 5, head 1, chunk 3)" in r.stdout
        assert "verdict: valid, with NaN/Inf in q (run, diff and taps need --allow-nonfinite)" in r.stdout
        assert "invalid" not in r.stdout
    d = json.loads(kdadbg("inspect", path, "--json").stdout)
    assert (d["ok"], d["verdict"], d["schema"]) == (True, "valid", INSPECT_JSON)
    assert d["nonfinite"] == [{"name": "q", "nan": 1, "inf": 1, "first": [1, 5, 1, 3], "batch": 1, "token": 5,
                               "head": 1, "sequence": 1, "chunk": 3}]
    assert json.loads(kdadbg("inspect", basic, "--json").stdout)["nonfinite"] == []


def test_inspect_describes_taps_files(tmp_path, basic):
    """User trial, round 42: inspect on a taps file (kdadbg taps, run --save, capture's .theirs) showed every
    tensor "(extra)" without stats, the raw metadata and "invalid". It says what the file is and holds (outputs,
    gradients, taps of which chunks and heads, with stats) and how to diff it; exit 0. diff and run recognise
    a run --save file as a taps file too."""
    taps, saved = tmp_path / "t.safetensors", tmp_path / "saved.safetensors"
    assert kdadbg("taps", basic, "-o", taps, "--taps", "L,S", "--chunks", "1:3", "--heads", "1").exit_code == 0
    assert kdadbg("run", basic, "--impl", "reference", "--save", saved).exit_code == 0
    r = kdadbg("inspect", taps)
    assert r.exit_code == 0 and r.stderr == "", r.output
    for line in ("a taps file (kdadbg-taps-v1), not a dump: made by `kdadbg taps`",
                 "source reference, precision float64, from dump basic.safetensors (inputs_sha256 ",
                 "outputs and gradients (whole tensors): o, ht, dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias",
                 "taps: L, S of chunks 1-2, heads 1", "verdict: valid taps file",
                 f"use it: kdadbg diff {basic} --against {taps}"):
        assert line in r.stdout, (line, r.stdout)
    assert "(extra)" not in r.stdout
    d = json.loads(kdadbg("inspect", taps, "--json").stdout)
    assert (d["schema"], d["ok"], d["kind"]) == (INSPECT_JSON, True, "taps file")
    f = d["taps_file"]
    assert (f["written_by"], f["taps"], f["chunks"], f["heads"]) == ("taps", ["L", "S"], [1, 2], [1])
    rows = {r["name"]: r for r in d["tensors"]}
    assert rows["tap.S"]["role"] == "tap" and rows["tap.S"]["shape"] == [2, 1, 16, 16] and rows["tap.S"]["min"] < 0
    r = kdadbg("inspect", saved)
    assert r.exit_code == 0, r.output
    assert "made by `kdadbg run --save`" in r.stdout and "taps: none" in r.stdout
    assert json.loads(kdadbg("inspect", basic, "--json").stdout)["kind"] == "dump"
    assert_one_error_line(kdadbg("run", saved), "is a taps file", "made by `kdadbg run --save`")
    assert_one_error_line(kdadbg("diff", saved), "is a taps file; diff needs the DUMP")


def test_the_diff_inspect_recommends_runs_and_a_recorded_precision_is_the_default(tmp_path, basic):
    """User trial, round 46: a taps file made with config overrides (`taps --gate softplus --chunk-size 32`, the
    README's example) got `use it: kdadbg diff DUMP --against FILE`, which then refused the file as made with
    another config; and `diff DUMP --against` a `run --precision bf16 --save` file judged it at fp32's tolerances
    by default (194 BUG, exit 1, a note saying so). inspect's command now carries the overrides, and diff judges a
    file at the precision it records unless --precision says otherwise."""
    taps, saved = tmp_path / "t.safetensors", tmp_path / "saved.safetensors"
    assert kdadbg("taps", basic, "-o", taps, "--gate", "softplus", "--chunk-size", "32").exit_code == 0
    use = json.loads(kdadbg("inspect", taps, "--json").stdout)["taps_file"]["use"]
    assert use.endswith(f"--against {taps} --gate softplus --chunk-size 32"), use
    r = kdadbg(*use.split()[1:])
    assert r.exit_code == 0 and "verdict: pass" in r.stdout, r.output
    assert kdadbg("run", basic, "--precision", "bf16", "--save", saved).exit_code == 0
    js = tmp_path / "d.json"
    r = kdadbg("diff", basic, "--against", saved, "--json", js)
    doc = json.loads(js.read_text())
    assert r.exit_code == 0 and doc["precision"] == "bf16" and doc["compared"]["bug"] == 0, r.output
    assert f"judged at precision bf16, the one {saved} records (its metadata)" in r.stdout, r.stdout
    r = kdadbg("diff", basic, "--against", saved, "--precision", "fp32")   # asked for: as asked
    assert r.exit_code == 1 and "was written at precision bf16" in r.stdout, r.output
    r = kdadbg("run", basic, "--impl", saved)   # run --impl FILE as well (it failed 7 tensors at fp32's bars)
    assert r.exit_code == 0 and f"judged at precision bf16, the one {saved} records" in " ".join(r.stdout.split())


def test_diff_of_two_taps_files_says_what_only_B_holds_and_taps_alone_are_partial(tmp_path, basic):
    """User trial, round 46: `diff A B` with A holding chunks 1 of head 1 and B every chunk and head, both
    written with --no-outputs, passed (exit 0) on 1 cell and said nothing of what B held beyond A, where the
    files swapped listed the chunks A lacked, and `diff DUMP --against` a no-outputs file is partial. Now B's
    extra chunks and heads are a note, and two files without outputs are partial (exit 3)."""
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert kdadbg("taps", basic, "-o", a, "--no-outputs", "--taps", "S", "--chunks", "1:2", "--heads", "1").exit_code == 0
    assert kdadbg("taps", basic, "-o", b, "--no-outputs", "--taps", "S").exit_code == 0
    r = kdadbg("diff", a, b)
    assert r.exit_code == 3 and "verdict: partial" in r.stdout, r.output
    assert "in neither file: written without outputs (taps --no-outputs)" in r.stdout
    assert f"{b} also holds chunks 0, 2-5 and head 0, which {a} (A, the reference file) does not: not compared" \
        in " ".join(r.stdout.split()), r.stdout


def test_an_output_named_as_another_format_is_refused_in_words_that_match_the_rule(tmp_path, basic):
    """User trial, round 46: `--save same.json` said "expected a name ending in .safetensors" while `--save
    foo.bin` was written: the rule is a suffix of another format, and the message says that."""
    r = kdadbg("run", basic, "--impl", "reference", "--save", tmp_path / "same.json")
    assert_one_error_line(r, "this output is safetensors, but .json is a JSON file's suffix: name it *.safetensors "
                             "(or with a suffix of no other format)")
    assert kdadbg("run", basic, "--impl", "reference", "--save", tmp_path / "foo.bin").exit_code == 0


def test_diff_of_two_taps_files_leaves_a_reduced_gradient_over_its_bar_unjudged(tmp_path):
    """User trial, round 46: `diff REF OURS_BF16` made our correct bf16 kernels' dA_log (0.022 against 1e-2) a
    BUG, exit 1, while `diff DUMP --against OURS_BF16` passed it (the carried-in rule needs the dump's inputs).
    Without the dump such a dA_log/ddt_bias is not compared: partial (exit 3), naming the command that judges
    it; within its bar it is compared as ever."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    dump, a, b = tmp_path / "k.safetensors", tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert kdadbg("gen", dump, "--preset", "kimi").exit_code == 0
    assert kdadbg("taps", dump, "-o", a, "--taps", "S").exit_code == 0
    with safe_open(str(a), "pt") as f:
        meta = f.metadata()
    t = load_file(str(a))
    save_file(dict(t, dA_log=t["dA_log"] * 1.5), str(b), metadata=meta)
    r = kdadbg("diff", a, b)
    text = " ".join(r.stdout.split())
    assert r.exit_code == 3 and "OK verdict: partial: nothing failed, but dA_log not compared" in text, r.output
    assert "without the dump a sum of dg over the head's tokens" in text and f"--against {b} judges it" in text
    r = kdadbg("diff", a, a)
    assert r.exit_code == 0 and "verdict: pass" in r.stdout, r.output


def test_a_quiet_heartbeat_shows_only_a_stage_that_lasts():
    """diff A B's progress (round 46): silent for its first seconds, so that a refusal of the files is the one
    line on stderr; a long read and comparison then shows its heartbeat."""
    import time

    from kdadbg.progress import beating

    calls = []
    with beating(lambda *a: calls.append(a), "reading and comparing", every_s=0.05, quiet_s=0.3):
        time.sleep(0.05)
    assert calls == []
    with beating(lambda *a: calls.append(a), "reading and comparing", every_s=0.05, quiet_s=0.1):
        time.sleep(0.4)
    assert calls and calls[0] == ("reading and comparing", 0, 1)


def test_inspect_malformed_taps_file(tmp_path, basic):
    """A taps file whose layout is broken (a tap's rows against its chunk table) is described as far as it can
    be and invalid: exit 2, one error line."""
    from safetensors.torch import load_file, save_file

    taps = tmp_path / "t.safetensors"
    assert kdadbg("taps", basic, "-o", taps, "--taps", "S", "--chunks", "1:3").exit_code == 0
    with safe_open(str(taps), "pt") as f:
        meta = f.metadata()
    t = load_file(str(taps))
    t["tap.S"] = t["tap.S"][:1].contiguous()
    save_file(t, str(tmp_path / "bad.safetensors"), metadata=meta)
    r = kdadbg("inspect", tmp_path / "bad.safetensors")
    assert_one_error_line(r, "tensor 'tap.S'", "expected shape [2,2,")
    assert "a taps file" in r.stdout and "verdict: invalid" in r.stdout and "tap.S" in r.stdout


def test_inspect_unreadable(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_text("hello")
    assert_one_error_line(kdadbg("inspect", path), str(path), "not a readable safetensors file")
    assert_one_error_line(kdadbg("inspect", tmp_path / "none.safetensors"), "file not found")


def test_taps_selection_layout_and_padding(tmp_path, basic):
    out = tmp_path / "t.safetensors"
    r = kdadbg("taps", basic, "-o", out, "--taps", "L,S,dgc,b", "--chunks", "1:3", "--heads", "1", "--device", "cpu")
    assert r.exit_code == 0, r.output
    f = read_taps_file(out)
    assert set(f["taps"]) == {"L", "S", "dgc", "b"}
    # global chunks 1, 2 of 6: row 0's second (full) and third (8 valid rows) chunks
    assert f["chunks"]["index"].tolist() == [1, 2] and f["chunks"]["seq"].tolist() == [0, 0]
    assert f["chunks"]["start"].tolist() == [16, 32] and f["chunks"]["len"].tolist() == [16, 8]
    assert f["heads"].tolist() == [1]
    assert f["taps"]["L"].shape == (2, 1, 16, 16) and f["taps"]["S"].shape == (2, 1, 16, 16)
    assert f["taps"]["b"].shape == (2, 1, 16) and f["taps"]["L"].dtype == torch.float64
    L = f["taps"]["L"][1, 0]
    assert (L[8:] == 0).all() and (L[:, 8:] == 0).all() and (L[:8, :8] != 0).any()
    assert (f["taps"]["dgc"][1, 0, 8:] == 0).all()
    inputs, cfg = load_dump(basic)
    ref = run_reference(inputs, cfg, taps=("L", "S"))
    assert torch.equal(f["taps"]["S"], ref.taps["S"][1:3, 1:2])
    assert torch.equal(f["taps"]["L"], ref.taps["L"][1:3, 1:2])
    assert set(f["outputs"]) == {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias"}
    assert torch.equal(f["outputs"]["dq"], ref.outputs["dq"])
    meta = f["metadata"]
    assert meta["source"] == "reference" and meta["dump"] == "basic.safetensors" and meta["gate"] == "lower_bound"


def test_taps_no_outputs_writes_the_selected_taps_alone(tmp_path, basic):
    """A user trial: ``taps --taps dS,dgc --chunks 2:4 --heads 1`` wrote every output and gradient whole (1.8 MB for
    a few kB of taps) and said nothing of it. The selection is the taps'; the summary says the outputs are whole
    tensors and what they cost; --no-outputs leaves them out, and both diffs still read such a file."""
    full, a, b = tmp_path / "full.safetensors", tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    sel = ("--taps", "dS,dgc", "--chunks", "1:3", "--heads", "1", "--device", "cpu")
    r = kdadbg("taps", basic, "-o", full, *sel)
    assert r.exit_code == 0, r.output
    assert "(whole tensors, " in r.stdout and "--no-outputs leaves them out" in r.stdout, r.stdout
    r = kdadbg("taps", basic, "-o", a, *sel, "--no-outputs", "--json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["outputs"] == [] and info["outputs_bytes"] == 0 and info["not_provided"] == []
    f = read_taps_file(a)
    assert f["outputs"] == {} and set(f["taps"]) == {"dS", "dgc"} and f["taps"]["dS"].shape == (2, 1, 16, 16)
    assert torch.equal(f["taps"]["dgc"], read_taps_file(full)["taps"]["dgc"])
    assert info["bytes"] == a.stat().st_size < full.stat().st_size / 4
    assert kdadbg("taps", basic, "-o", b, *sel, "--no-outputs", "--source", "ours").exit_code == 0
    r = kdadbg("diff", a, b)          # the taps both hold pass; no outputs in either: partial, as --against (round 46)
    assert r.exit_code == 3 and "verdict: partial" in r.stdout and "4 OK" in r.stdout, r.output
    r = kdadbg("diff", basic, "--against", b, "--window", 0, "--device", "cpu")
    assert r.exit_code == 3 and "verdict: partial" in r.stdout and "4 OK" in r.stdout, r.output  # outputs: not provided
    assert_one_error_line(kdadbg("taps", basic, "-o", tmp_path / "n.safetensors", "--taps", "none", "--no-outputs"),
                          "--no-outputs", "nothing to write")


def test_taps_precision_says_what_was_computed(tmp_path, basic):
    """A user trial: ``taps --source reference --json`` said ``"precision": "fp32"`` (the tolerance table the
    reference is judged at under ``run``/``diff --impl reference``) though it computes in float64."""
    out = tmp_path / "r.safetensors"
    r = kdadbg("taps", basic, "-o", out, "--taps", "dS", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["impl"]["precision"] == "float64"
    assert read_taps_file(out)["metadata"]["precision"] == "float64"
    # readers: diff --against the file judges it at --precision's tolerances, without a note on its precision
    r = kdadbg("diff", basic, "--against", out, "--window", 0, "--device", "cpu", "--precision", "bf16", "--json",
               tmp_path / "d.json")
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "d.json").read_text())
    assert doc["verdict"] == "pass" and not any("written at precision" in n for n in doc["notes"]), doc["notes"]
    # run --impl reference --save says the same of its file (it said fp32, its tolerance table: round 41)
    saved = tmp_path / "s.safetensors"
    r = kdadbg("run", basic, "--impl", "reference", "--save", saved, "--device", "cpu")
    assert r.exit_code == 0 and read_taps_file(saved)["metadata"]["precision"] == "float64", r.output


def test_taps_outputs_that_apply(tmp_path):
    dump, out = tmp_path / "d.safetensors", tmp_path / "t.safetensors"
    assert kdadbg("gen", dump, "--preset", "varlen_kv").exit_code == 0
    r = kdadbg("taps", dump, "-o", out, "--taps", "none", "--gate", "none")
    assert r.exit_code == 0, r.output
    f = read_taps_file(out)
    assert f["taps"] == {} and set(f["outputs"]) == {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"}
    assert f["outputs"]["ht"].shape == (3, 2, 16, 16) and f["metadata"]["gate"] == "none"
    assert f["chunks"]["start"].tolist() == [0, 7, 23, 39, 40, 56]  # packed token index for varlen


def test_taps_config_overrides_reach_the_run(tmp_path, basic):
    out = tmp_path / "t.safetensors"
    r = kdadbg("taps", basic, "-o", out, "--taps", "L", "--chunk-size", 32, "--scale", 0.5, "--no-qk-l2norm",
               "--lower-bound", -3, "--no-beta-sigmoid", "--json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["config"] == {"scale": 0.5, "chunk_size": 32, "gate": "lower_bound", "lower_bound": -3.0,
                              "qk_l2norm": False, "beta_sigmoid": False, "state_layout": "vk"}
    # the chunk ids written, a list as "heads" is and as diff's JSON lists them (it was the range [0, 4])
    assert info["chunks"] == [0, 1, 2, 3] and info["n_chunks"] == 4 and info["heads"] == [0, 1]
    assert info["schema"] == 2 and info["decay_note"] is None and "JSON (schema 2)" in re.sub(r"[\s│]+", " ", runner.invoke(cli.app, ["taps", "--help"]).stdout)
    f = read_taps_file(out)
    assert f["taps"]["L"].shape == (4, 2, 32, 32) and f["chunks"]["len"].tolist() == [32, 8, 32, 8]
    assert f["metadata"]["chunk_size"] == "32" and f["metadata"]["qk_l2norm"] == "false"


def test_every_command_with_a_dump_has_every_config_override():
    helps = kdadbg("taps", "--help").stdout
    for opt in ("--chunk-size", "--scale", "--gate", "--lower-bound", "--state-layout", "--qk-l2norm",
                "--beta-sigmoid"):
        assert opt in helps
    assert set(cli.CONFIG_OPTIONS) == {"chunk_size", "scale", "gate", "lower_bound", "state_layout", "qk_l2norm",
                                       "beta_sigmoid"}


@pytest.mark.parametrize("args, fragments", [
    pytest.param(["--taps", "dS,bogus"], ["unknown tap 'bogus'", "dgc", "fwd_prepare"], id="unknown-tap"),
    pytest.param(["--taps", "ds"], ["unknown tap 'ds' (did you mean dS?)"], id="tap-case-near-miss"),
    pytest.param(["--taps", "dgcc"], ["unknown tap 'dgcc' (did you mean dgc?)"], id="tap-spelling-near-miss"),
    pytest.param(["--chunks", "6:9"], ["selects no chunk", "6 chunks"], id="chunks-past-end"),
    pytest.param(["--chunks", "3:1"], ["A < B"], id="chunks-reversed"),
    pytest.param(["--chunks", "a:b"], ["--chunks"], id="chunks-syntax"),
    pytest.param(["--chunks", "-2:"], ["non-negative"], id="chunks-negative"),
    pytest.param(["--heads", "0,2"], ["head 2 out of range", "H=2"], id="head-out-of-range"),
    pytest.param(["--heads", "1,1"], ["distinct"], id="head-duplicate"),
    pytest.param(["--chunk-size", 48], ["chunk_size", "48"], id="chunk-size-48"),
])
def test_taps_bad_requests(tmp_path, basic, args, fragments):
    out = tmp_path / "t.safetensors"
    assert_one_error_line(kdadbg("taps", basic, "-o", out, *args), *fragments)
    assert not out.exists()


def test_taps_source_is_a_choice(tmp_path, basic):
    r = kdadbg("taps", basic, "-o", tmp_path / "t.safetensors", "--source", "oracle")
    assert r.exit_code == 2 and "reference" in r.output and "ours" in r.output and "PATH.py:FUNCTION" in r.output


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_taps_cuda_without_gpu(tmp_path, basic):
    assert_one_error_line(kdadbg("taps", basic, "-o", tmp_path / "t.safetensors", "--device", "cuda"),
                          "no CUDA device")


def test_taps_refuses_overwrite(tmp_path, basic):
    out = tmp_path / "t.safetensors"
    out.write_bytes(b"keep me")
    assert_one_error_line(kdadbg("taps", basic, "-o", out, "--taps", "none"), str(out), "already exists")
    assert out.read_bytes() == b"keep me"
    assert kdadbg("taps", basic, "-o", out, "--taps", "none", "--force").exit_code == 0
    assert read_taps_file(out)["outputs"]


def test_taps_takes_the_file_to_write_after_the_dump_too(tmp_path, basic):
    """`kdadbg taps DUMP OUT` as `kdadbg gen OUT` takes its file (it was a usage error); OUT and -o together: one
    line naming both, nothing written."""
    out, other = tmp_path / "t.safetensors", tmp_path / "u.safetensors"
    r = kdadbg("taps", basic, out, "--taps", "none")
    assert r.exit_code == 0 and read_taps_file(out)["outputs"], r.output
    assert_one_error_line(kdadbg("taps", basic, other, "-o", out, "--taps", "none", "--force"), "given twice",
                          str(other), str(out))
    assert not other.exists()


def test_taps_nonfinite_inputs(tmp_path):
    dump, out = tmp_path / "d.safetensors", tmp_path / "t.safetensors"
    inputs, cfg = make_inputs(get_case("t16"))
    inputs.v[0, 3, 0, 2] = float("nan")
    from kdadbg.dump import save_dump
    save_dump(dump, inputs, cfg)
    assert_one_error_line(kdadbg("taps", dump, "-o", out), "tensor 'v'", "first at [0,3,0,2]")
    r = kdadbg("taps", dump, "-o", out, "--allow-nonfinite", "--taps", "U")
    assert r.exit_code == 1 and "non-finite" in r.stdout and out.exists()


@pytest.mark.parametrize("name", ["golden_basic", "golden_varlen_kv", "golden_softplus_c32_bf16"])
def test_taps_matches_golden(tmp_path, name):
    out = tmp_path / "t.safetensors"
    r = kdadbg("taps", GOLDEN / f"{name}.safetensors", "-o", out, "--device", "cpu")
    assert r.exit_code == 0, r.output
    got, want = read_taps_file(out), read_taps_file(GOLDEN / f"{name}.expected.safetensors")
    assert set(got["outputs"]) == set(want["outputs"]) and set(got["taps"]) == set(want["taps"]) == set(TAP_NAMES)
    for key in want["chunks"]:
        assert torch.equal(got["chunks"][key], want["chunks"][key]), key
    assert torch.equal(got["heads"], want["heads"])
    for group in ("outputs", "taps"):
        for key, w in want[group].items():
            g = got[group][key]
            assert g.shape == w.shape and g.dtype == torch.float64, key
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12 * max(1.0, w.abs().max().item()), msg=key)


def test_main_prints_one_red_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", ["kdadbg", "inspect", str(tmp_path / "missing.safetensors")])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "file not found" in err[0]


def test_python_dash_m_help():
    r = subprocess.run([sys.executable, "-m", "kdadbg", "--help"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and all(c in r.stdout for c in ("gen", "inspect", "taps"))


@pytest.mark.parametrize("command, extra", [pytest.param("run", [], id="run"),
                                            pytest.param("diff", ["--taps", "none", "--window", "0"], id="diff")])
def test_json_help_names_the_schema_written(command, extra, tmp_path):
    """--help's "--json ... (schema N)" is the schema the command writes."""
    import re

    helps = re.sub(r"[\s│]+", " ", runner.invoke(cli.app, [command, "--help"]).stdout)   # lines unwrapped
    quoted = re.findall(r"JSON \(schema (\d+)\)", helps)
    out = tmp_path / "r.json"
    r = kdadbg(command, REPO / "sample_inputs" / "basic.safetensors", "--impl", "reference", *extra, "--json", out)
    assert r.exit_code == 0, r.output
    assert quoted == [str(json.loads(out.read_text())["schema"])], helps


def test_taps_list_prints_each_meaning_whole_and_export_names_what_was_not_provided(tmp_path, basic):
    """User trial, round 38: `taps --list` printed dU's meaning as `Mqk^T dO + kr dS` (Rich took `[c+1]` for
    markup), and a source that does not write a requested tap said `0 taps` and nothing more."""
    from kdadbg_kernels.taps import TAPS

    r = kdadbg("taps", "--list")
    assert r.exit_code == 0
    for tap in TAPS:
        assert tap.meaning in r.stdout, tap.name
    fn = tmp_path / "only_o.py"
    fn.write_text("from kdadbg.reference import run_reference\n"
                  "import kdadbg_kernels\n"
                  "def f(q, k, v, g, beta, **kw):\n"
                  "    return kdadbg_kernels.chunk_kda(q, k, v, g, beta, **kw)\n")
    out = tmp_path / "t.safetensors"
    r = kdadbg("taps", basic, out, "--source", f"{fn}:f", "--taps", "dS")
    assert r.exit_code == 0 and f"not provided by {fn}:f: dS" in r.stdout, r.output


def test_options_that_apply_are_taken(tmp_path, basic):
    """The refusals of options that would be ignored leave the cases they apply to (and the defaults) alone."""
    taps = tmp_path / "a.taps.safetensors"
    assert kdadbg("taps", basic, "-o", taps, "--taps", "S").exit_code == 0
    for args in (["diff", basic, "--against", taps],                      # the default --window: no rerun, no error
                 ["diff", basic, "--against", taps, "--window", "0", "--taps-state-layout", "kv"],
                 ["diff", taps, taps, "--taps-gate-units", "ln", "--repeat", "1"],
                 ["diff", basic, "--impl", "reference", "--taps", "none", "--chunks", "1:3", "--full-run"],
                 ["run", basic, "--impl", "reference", "--gate", "lower_bound", "--lower-bound", "-3"],
                 ["taps", basic, "-o", tmp_path / "k.safetensors", "--source", "ours", "--precision", "bf16",
                  "--taps", "none", "--device", "cpu"]):
        r = kdadbg(*args)
        assert r.exit_code == 0, (args, r.output)


def test_fla_cpu_warning_is_silenced_and_nothing_else():
    """`--impl fla` on the CPU printed fla's `UserWarning: Triton is not supported on current platform, roll
    back to CPU.` on every run: that warning, and only it, is silenced around fla's import and calls."""
    import warnings

    from kdadbg.impls import fla as F

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with F.quiet_cpu_warning():
            warnings.warn("Triton is not supported on current platform, roll back to CPU.", UserWarning)
            warnings.warn("something else", UserWarning)
    assert [str(w.message) for w in caught] == ["something else"]


def test_fla_refuses_16_bit_on_the_cpu_saying_how_to_get_float32(monkeypatch):
    from kdadbg.errors import KdadbgError
    from kdadbg.impls import fla as F

    monkeypatch.setattr(F, "installed_version", lambda: F.FLA_VERSION)
    inputs, cfg = make_inputs(get_case("bf16"))
    with pytest.raises(KdadbgError, match=r"kdadbg gen \.\.\. --dtype float32"):
        F.Fla("bf16").run(inputs, cfg, device="cpu")


@pytest.mark.skipif(HAS_GPU, reason="the warning is the CPU's")
def test_fla_run_on_the_cpu_shows_no_platform_warning(tmp_path):
    from kdadbg.impls import fla as F

    if F.installed_version() != F.FLA_VERSION:
        pytest.skip(f"needs fla-core {F.FLA_VERSION}")
    dump = tmp_path / "d.safetensors"
    assert kdadbg("gen", dump, "--preset", "t16", "--K", 16, "--V", 16).exit_code == 0
    r = subprocess.run([sys.executable, "-m", "kdadbg", "run", str(dump), "--impl", "fla", "--chunk-size", "32",
                        "--device", "cpu"], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stderr
    assert "Triton is not supported" not in r.stderr and "Warning" not in r.stderr, r.stderr


def _bash_block(readme: str, heading: str) -> list[str]:
    """The command lines of the first ```bash block under ``heading``, comments dropped."""
    block = re.search(r"```bash\n(.*?)```", readme[readme.index(heading):], re.S).group(1)
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_readme_taps_and_diff_examples_run_as_written(tmp_path, monkeypatch):
    """User trial: the fourth `kdadbg taps` example wrote t.safetensors, which the third had written (refused
    without --force), and the diff examples read ours/theirs.taps.safetensors that no example made. Here the
    taps examples run in one folder, then the diff examples on taps files, each file they read made before."""
    import shlex

    readme = (REPO / "README.md").read_text()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sample_inputs").symlink_to(REPO / "sample_inputs")
    assert kdadbg("gen", "my.safetensors").exit_code == 0
    kernel = re.search(r"```python\n(.*?)```", readme[readme.index("A 20-line implementation"):], re.S).group(1)
    (tmp_path / "my_kernel.py").write_text(kernel)
    ran = []
    for heading in ("### `kdadbg taps`", "### `kdadbg diff`"):
        for line in _bash_block(readme, heading):
            args = shlex.split(line)[1:]
            if args[0] == "diff":
                files = [a for a in args if a.endswith(".taps.safetensors")]
                if not files or not all((tmp_path / f).exists() for f in files):
                    continue   # not about taps files, or one the user's own code writes
            r = kdadbg(*args)
            assert r.exit_code == 0, (line, r.output)
            ran.append(line)
    assert any("-o ours.taps.safetensors" in line for line in ran), ran
    assert any(line.startswith("kdadbg diff ours.taps.safetensors theirs.taps.safetensors") for line in ran), ran
    assert any("--against theirs.taps.safetensors" in line for line in ran), ran


def test_a_stage_that_reports_nothing_itself_still_shows_its_elapsed_time(tmp_path):
    """User trial, round 40: `diff --impl fla` printed "fla: 0/1" then "fla: 1/1 (132.8 s)" and nothing in
    between, as did the noise floor, the reference in `taps` and the file write. A stage without progress of
    its own now beats: in a log, a line with its elapsed time at most every 5 s (here every 0.05 s)."""
    import time

    from kdadbg.progress import beating, ticking

    calls = []
    with beating(lambda *a: calls.append(a), "fla", every_s=0.05):
        time.sleep(0.3)
    assert len(calls) >= 4 and set(calls) == {("fla", 0, 1)}
    n = len(calls)
    time.sleep(0.15)
    assert len(calls) == n                      # stopped with the stage
    calls.clear()
    with ticking(lambda *a: calls.append(a), "ref", None, every_s=0.05):
        time.sleep(0.2)
    assert calls[0] == ("ref", 0, 1) and calls[-1] == ("ref", 1, 1) and len(calls) >= 3


def test_a_checkout_on_pythonpath_runs_its_own_kernels(tmp_path):
    """User trial, round 41: a clone run with PYTHONPATH=clone imported kdadbg from the clone and
    kdadbg_kernels, through the editable install, from the installed checkout: a kernel edited in the clone
    was never run. A checkout's kdadbg takes the kernels/ beside it."""
    import shutil

    tree = tmp_path / "clone"
    for part in ("kdadbg", "kernels"):
        shutil.copytree(REPO / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import kdadbg, kdadbg_kernels, kdadbg_kernels.taps; "
            "print(kdadbg.__file__); print(kdadbg_kernels.__file__); print(kdadbg_kernels.taps.__file__)")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    files = r.stdout.split()
    assert files == [str(tree / "kdadbg" / "__init__.py"), str(tree / "kernels" / "__init__.py"),
                     str(tree / "kernels" / "taps.py")], files


def test_inspect_says_a_lower_bound_the_gate_does_not_use(tmp_path, basic):
    """User trial, round 41: a softplus dump (a fla layer's, gen's fla_layer) listed `lower_bound -5.0 file` as
    any other value in use. It says the gate does not use it; a lower-bound dump's is plain."""
    dump = tmp_path / "sp.safetensors"
    assert kdadbg("gen", dump, "--preset", "fla_layer").exit_code == 0
    row = next(x for x in kdadbg("inspect", dump).stdout.splitlines() if "lower_bound" in x)
    assert "unused: gate softplus" in row, row
    row = next(x for x in kdadbg("inspect", basic).stdout.splitlines() if "lower_bound" in x and "gate" not in x)
    assert "unused" not in row, row


def test_help_and_option_errors_start_without_torch():
    """`kdadbg --help` and a refused option need no torch: the tap registry imports it where a buffer is made, so
    the command line's import is about 0.2 s instead of torch's seconds (and a Ctrl-C then cannot land inside
    torch's import before any handler)."""
    code = ("import sys; import kdadbg.cli; from kdadbg_kernels import TAP_NAMES, REGISTRY; "
            "assert TAP_NAMES and REGISTRY; print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert (r.returncode, r.stdout.strip()) == (0, "False"), r.stderr


def test_an_interrupt_before_the_command_is_one_line(monkeypatch, capsys):
    """A Ctrl-C while the options are read (outside a command's own handler) is one line and exit 130."""
    from kdadbg import cli

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "app", interrupted)
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: interrupted (SIGINT) before the command started") and "\n" not in err, err


@pytest.mark.parametrize("command", ["taps", "diff"])
def test_help_at_80_columns_is_two_readable_columns(command):
    """Rich's four-column panels left an option's help about 20 characters at 80 columns (user trial, round 46):
    below 100 columns --help is click's two columns, the help wrapped to the width, no markup escapes; 100 and
    wider keep rich's panels."""
    env = {**__import__("os").environ, "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "kdadbg", command, "--help"], capture_output=True, text=True, cwd=REPO,
                       env=env)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[0].startswith(f"Usage: python -m kdadbg {command} [OPTIONS]"), r.stdout
    assert "╭" not in r.stdout and "\\[" not in r.stdout and max(map(len, lines)) <= 80
    impl = next(i for i, x in enumerate(lines) if x.lstrip().startswith("--impl") or "--source, --impl" in x)
    assert len(lines[impl + 1].strip()) > 30, lines[impl:impl + 3]   # a line of help, not a word or two
    env["COLUMNS"] = "120"
    r = subprocess.run([sys.executable, "-m", "kdadbg", command, "--help"], capture_output=True, text=True, cwd=REPO,
                       env=env)
    assert r.returncode == 0 and "╭─ Options" in r.stdout
