"""Verdict honesty: every verdict says how much it compared, and what compared nothing is never a pass.

Rows and cells with no element compared (every one NaN/Inf on both sides) are "not compared", never
pass/OK; a run that provides or compares only part of the outputs is PARTIAL (exit 3), one that compares
nothing is NOT COMPARED (exit 2); FAIL lines give the counts; "no divergence" names UNREP cells; two taps
files (diff A B) compare the outputs and gradients both hold."""

import dataclasses
import json

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from conftest import REPO
from kdadbg import cli
from kdadbg.cases import get_case, make_inputs
from kdadbg.diff import diff_dump, diff_taps_files
from kdadbg.dump import save_dump
from kdadbg.impls import Implementation, ImplRun, resolve_impl
from kdadbg.reference import run_reference
from kdadbg.render import difftables, tables
from kdadbg.render.plot import diff_plot_data, run_plot_data
from kdadbg.run import check
from kdadbg.tapsfile import chunk_rows, read_taps_file, taps_metadata, write_taps_file

runner = CliRunner()
IMPL = str(REPO / "tests" / "impls" / "torch_kda.py")


def rendered(fn, result) -> str:
    con = Console(record=True, width=250, highlight=False)
    fn(con, result)
    return con.export_text()


def nan_inputs(name="basic", field="v"):
    inputs, config = make_inputs(get_case(name))
    t = getattr(inputs, field)
    return dataclasses.replace(inputs, **{field: torch.full_like(t, float("nan"))}), config


class NanOutput(Implementation):
    """The float64 reference, with one output all NaN (the rest exact)."""
    name = kind = "nan-output"

    def __init__(self, output="o"):
        self.output = output

    def run(self, inputs, config, *, device, taps=None):
        outs = dict(run_reference(inputs, config, taps=()).outputs)
        outs[self.output] = torch.full_like(outs[self.output], float("nan"))
        return ImplRun(outs)


# --- 1. rows and cells that compared nothing ---------------------------------------------------------


def test_run_rows_with_nothing_compared_are_not_passes(tmp_path):
    inputs, config = nan_inputs()        # v all NaN: most outputs NaN on both sides; dv, dh0 finite
    res = check(inputs, config, impl=resolve_impl("reference"))
    rows = {t.name: t for t in res.tensors}
    assert rows["o"].count == 0 and rows["o"].passed is None and "NaN/Inf on both sides" in rows["o"].reason
    assert rows["dv"].count > 0 and rows["dv"].passed is True
    assert res.verdict == "partial" and not res.passed
    doc = json.loads(json.dumps(res.as_json(), allow_nan=False))
    assert doc["schema"] == 7 and doc["verdict"] == "partial"
    o = next(t for t in doc["tensors"] if t["name"] == "o")
    assert o["pass"] is None and o["reason"] and o["ratio"] is None and o["cosine"] is None and o["max_index"] is None
    assert doc["compared"]["tensors"] == 2 and "o" in doc["compared"]["not_compared"]
    text = rendered(tables.render_run, res)
    o_line = next(line for line in text.splitlines() if line.startswith("│ o "))
    assert "not compared" in o_line and "pass" not in o_line and "1.00000000" not in o_line
    assert "PARTIAL" in text and "PASS" not in text and "8 not compared" in text
    plot = run_plot_data(res)
    assert next(t for t in plot["tensors"] if t["name"] == "o")["passed"] is None
    assert "PARTIAL" in plot["title"] and "in 2 of 10 tensors" in plot["title"]
    dump = save_dump(tmp_path / "allnan.safetensors", inputs, config)
    r = runner.invoke(cli.app, ["run", str(dump), "--impl", "reference", "--allow-nonfinite"])
    assert r.exit_code == 3, r.output
    assert "PARTIAL" in r.stdout and "not compared" in r.stdout


def test_run_where_nothing_was_compared_is_not_a_pass(tmp_path):
    inputs, config = nan_inputs(field="k")      # k all NaN: every output and gradient NaN on both sides
    res = check(inputs, config, impl=resolve_impl("reference"))
    assert all(t.count == 0 for t in res.tensors) and res.verdict == "not_compared" and not res.passed
    assert res.as_json()["verdict"] == "not_compared"
    dump = save_dump(tmp_path / "k.safetensors", inputs, config)
    r = runner.invoke(cli.app, ["run", str(dump), "--impl", "reference", "--allow-nonfinite"])
    assert r.exit_code == 2, r.output
    assert "NOT COMPARED" in r.stdout and "PASS" not in r.stdout and "0 elements compared in 0 of 10" in r.stdout


def test_diff_cells_with_nothing_compared_are_not_ok(tmp_path):
    inputs, config = make_inputs(get_case("masked_gates"))
    res = diff_dump(inputs, config, resolve_impl("reference"), window=0)
    dqd = res.cells["dqd"]
    assert bool((dqd.count == 0).all())
    n = res.counts()
    assert n["not_compared"] > 0 and n["ok"] == n["cells"]     # OK counts only cells that compared something
    doc = json.loads(json.dumps(res.as_json(), allow_nan=False))
    assert doc["schema"] == 12 and doc["compared"]["not_compared"] == n["not_compared"]
    cells = [c for c in doc["cells"] if c["tap"] == "dqd"]
    assert cells and all(c["label"] == "NOT_COMPARED" and c["ratio"] is None and c["reason"] for c in cells)
    assert not any(c["label"] == "OK" for c in doc["cells"] if c["count"] == 0)
    assert doc["min_tolerance"]["dqd"]["min_tol"] is None and doc["min_tolerance"]["dqd"]["not_compared"] > 0
    grid = {r["tap"]: r["cells"] for r in res.grid()["rows"]}
    assert all(c["label"] == "NOT_COMPARED" and c["ratio"] is None for c in grid["dqd"])
    plot = diff_plot_data(res)
    i = [r["name"] for r in plot["rows"]].index("dqd")
    assert set(plot["status"][i]) == {"not_compared"} and set(plot["log10_ratio"][i]) == {None}
    text = rendered(difftables.render, res)
    dqd_line = next(line for line in text.splitlines() if line.startswith("dqd"))
    assert "—" in dqd_line and " 0" not in dqd_line
    assert f"{n['not_compared']} cells not compared" in text


def test_diff_where_nothing_was_compared_is_not_a_pass(tmp_path):
    inputs, config = nan_inputs(field="k")
    res = diff_dump(inputs, config, resolve_impl("reference"), names=(), window=0)
    assert res.counts()["cells"] == 0 and res.verdict == "not_compared" and not res.passed
    dump = save_dump(tmp_path / "k.safetensors", inputs, config)
    r = runner.invoke(cli.app, ["diff", str(dump), "--impl", "reference", "--taps", "none", "--allow-nonfinite",
                                "--window", "0"])
    assert r.exit_code == 2, r.output
    assert "verdict: not compared" in r.stdout and "no divergence:" not in r.stdout


class NanTap(Implementation):
    """The float64 reference with its taps, one of them all NaN (padding rows included): a tap not written."""
    name = kind = "nan-tap"
    provides_taps = True

    def __init__(self, tap):
        self.tap = tap

    def run(self, inputs, config, *, device, taps=None):
        ref = run_reference(inputs, config, taps=taps.names)
        t = {n: v.clone() for n, v in ref.taps.items()}
        t[self.tap] = torch.full_like(t[self.tap], float("nan"))
        n = ref.chunks.n_chunks
        return ImplRun(dict(ref.outputs), t, list(range(n)), list(range(inputs.HV)))


def test_diff_with_gradients_nan_on_both_sides_is_partial_not_pass(tmp_path):
    """do all NaN: every gradient NaN on both sides, o compared. diff said pass (exit 0) where run says
    partial (user trial, round 39); and a tap all NaN where the reference is NaN in every valid row (finite
    only in its padding) is not "not written": nothing says whether it was."""
    inputs, config = nan_inputs(field="do")
    res = diff_dump(inputs, config, NanTap("dU"), names=("U", "dU"), window=0)
    assert res.verdict == "partial" and not res.passed
    assert set(res.outputs_not_compared) == {"dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias"}
    assert res.cells["o"].count.sum() > 0 and "o" not in res.outputs_not_compared
    assert res.missing["not_written"] == [] and res.as_json()["outputs_not_compared"] == res.outputs_not_compared
    text = rendered(difftables.render, res)
    assert "verdict: partial: nothing failed, but dh0, dv, dq, dk" in text and "not compared (NaN/Inf on both sides" in text
    clean, _ = make_inputs(get_case("basic"))    # the same tap on a finite dump: not written, and it fails
    res = diff_dump(clean, config, NanTap("dU"), names=("U", "dU"), window=0)
    assert res.missing["not_written"] == ["dU"] and res.verdict == "fail"
    dump = save_dump(tmp_path / "nan_do.safetensors", inputs, config)
    r = runner.invoke(cli.app, ["diff", str(dump), "--impl", "reference", "--allow-nonfinite", "--window", "0"])
    assert r.exit_code == 3 and "verdict: partial" in r.stdout, r.output


def test_taps_asked_for_by_name_are_listed_when_the_implementation_has_none():
    """`--taps dS` with an implementation that writes no taps compared 0 tap cells and said nothing of dS
    (user trial, round 39); all taps by default, it lists none (there are none to miss)."""
    inputs, config = make_inputs(get_case("basic"))
    impl = resolve_impl(f"{IMPL}:chunk_kda")
    assert diff_dump(inputs, config, impl, names=("dS",), window=0).missing["taps"] == ["dS"]
    assert diff_dump(inputs, config, impl, window=0).missing["taps"] == []


# --- 2. undefined figures are not made up ----------------------------------------------------------


def test_an_all_nan_output_has_no_cosine():
    inputs, config = make_inputs(get_case("basic"))
    res = check(inputs, config, impl=NanOutput("o"))
    o = res.tensors[0]
    assert o.name == "o" and o.passed is False and o.nonfinite == o.count > 0
    doc = res.as_json()["tensors"][0]
    assert doc["cosine"] is None and doc["ratio"] is None and doc["max_abs"] is None
    o_line = next(line for line in rendered(tables.render_run, res).splitlines() if line.startswith("│ o "))
    assert "1.00000000" not in o_line and "—" in o_line and "FAIL" in o_line
    d = diff_dump(inputs, config, NanOutput("o"), names=(), window=0)
    cell = next(c for c in d.as_json()["cells"] if c["tap"] == "o")
    assert cell["cosine"] is None and d.first_divergence["cosine"] is None


# --- 3. FAIL says how much it compared ---------------------------------------------------------------


def test_the_fail_line_gives_the_counts():
    inputs, config = make_inputs(get_case("basic"))
    res = check(inputs, config, impl=NanOutput("dk"))
    assert not res.passed
    line = next(ln for ln in rendered(tables.render_run, res).splitlines() if ln.startswith("FAIL"))
    assert f"{res.elements} elements compared in 10 of 10 tensors" in line and "dk over tolerance" in line


# --- 4. forward only is not a full pass ----------------------------------------------------------------


def test_a_forward_only_implementation_is_partial_not_pass(tmp_path):
    inputs, config = make_inputs(get_case("basic"))
    res = check(inputs, config, impl=resolve_impl(f"{IMPL}:forward_only"))
    assert res.verdict == "partial" and not res.passed and res.as_json()["verdict"] == "partial"
    dump = save_dump(tmp_path / "d.safetensors", inputs, config)
    r = runner.invoke(cli.app, ["run", str(dump), "--impl", f"{IMPL}:forward_only"])
    assert r.exit_code == 3, r.output
    assert "PARTIAL" in r.stdout and "PASS" not in r.stdout and "8 not provided" in r.stdout
    assert "in 2 of 10 tensors" in r.stdout   # the denominator: the tensors that apply (it was 2 of 2)


# --- 5. "no divergence" with UNREP cells -----------------------------------------------------------------


def test_no_divergence_names_the_unrep_cells():
    from test_impls import _Bf16Storage, case_inputs

    inputs, config = case_inputs("t200")
    res = diff_dump(inputs, config, _Bf16Storage(), names=("S", "U"), window=0)
    n = res.counts()
    assert res.passed and res.first_divergence is None and n["unrep"] > 0
    text = rendered(difftables.render, res)
    line = next(ln for ln in text.splitlines() if ln.startswith("no divergence"))
    assert "every compared cell is within its tolerance" not in line
    assert f"or UNREP ({n['unrep']} cells over it that the precision cannot judge)" in line
    assert "UNREP" in diff_plot_data(res)["no_divergence"]
    assert "but UNREP ones" in text   # (the legend's min tol)
    m = res.min_tolerance()["o"]
    assert m["unrep"] > 0 and (m["min_tol"] is None or m["min_tol"] <= m["tol"])


# --- 6. two taps files compare their outputs and gradients ---------------------------------------------


def _write(tmp_path, name, inputs, config, taps=("dU",), chunks=None, outputs=None):
    res = run_reference(inputs, config, taps=taps)
    lo, hi = chunks or (0, res.chunks.n_chunks)
    outs = dict(res.outputs)
    if outputs:
        outs = outputs(outs)
    path = tmp_path / name
    write_taps_file(path, outs, {n: t[lo:hi].clone() for n, t in res.taps.items()}, chunk_rows(res.chunks, lo, hi),
                    list(range(inputs.HV)), taps_metadata("reference", "dump.safetensors", config))
    return path


def _wrong(outs):
    return {**outs, "o": torch.full_like(outs["o"], 7.0), "dk": outs["dk"] * 1.5}


def test_two_taps_files_compare_their_outputs_and_gradients(tmp_path):
    inputs, config = make_inputs(get_case("basic"))
    a = _write(tmp_path, "a.safetensors", inputs, config)
    b = _write(tmp_path, "b.safetensors", inputs, config, outputs=_wrong)
    res = diff_taps_files(read_taps_file(a), read_taps_file(b))
    assert not res.passed and res.first_divergence["tap"] == "o"
    assert bool((res.cells["dk"].label == 2).all()) and res.counts()["row_cells"] > 0
    same = diff_taps_files(read_taps_file(a), read_taps_file(a))
    assert same.passed and same.counts()["row_cells"] > 0 and {"o", "dk", "ht", "dh0", "dA_log"} <= set(same.cells)
    r = runner.invoke(cli.app, ["diff", str(a), str(b)])
    assert r.exit_code == 1, r.output
    assert "0 output/gradient row" not in r.stdout and "verdict: fail" in r.stdout


def test_two_varlen_taps_files_compare_outputs_or_say_why_not(tmp_path):
    inputs, config = make_inputs(get_case("varlen"))       # cu_seqlens [0,15,100,300]
    a = _write(tmp_path, "a.safetensors", inputs, config)
    b = _write(tmp_path, "b.safetensors", inputs, config, outputs=_wrong)
    res = diff_taps_files(read_taps_file(a), read_taps_file(b))
    assert not res.passed and res.first_divergence["tap"] == "o" and "ht" in res.cells
    # only the last sequence's chunks: the files do not place the packed tokens without the dump
    part_a = _write(tmp_path, "pa.safetensors", inputs, config, chunks=(7, 20))
    part_b = _write(tmp_path, "pb.safetensors", inputs, config, chunks=(7, 20), outputs=_wrong)
    res = diff_taps_files(read_taps_file(part_a), read_taps_file(part_b))
    assert "o" not in res.cells and "not placed in chunks" in res.not_provided["o"]
    assert any("outputs and gradients not compared" in n for n in res.notes)


# --- 7. display and JSON of undefined and non-finite figures -------------------------------------------


class OneBadElement(Implementation):
    """The float64 reference, with one element of ``o`` replaced (NaN, Inf, or o all zeros)."""
    name = kind = "one-bad-element"

    def __init__(self, value):
        self.value = value

    def run(self, inputs, config, *, device, taps=None):
        outs = dict(run_reference(inputs, config, taps=()).outputs)
        o = outs["o"].clone()
        if self.value == "zeros":
            o.zero_()
        else:
            o[0, 5, 0, 3] = self.value
        outs["o"] = o
        return ImplRun(outs)


def test_nothing_compared_has_no_scale():
    inputs, config = nan_inputs()        # v all NaN: o NaN on both sides, dv compared
    doc = check(inputs, config, impl=resolve_impl("reference")).as_json()
    rows = {t["name"]: t for t in doc["tensors"]}
    assert rows["o"]["count"] == 0 and rows["o"]["scale"] is None and rows["o"]["abs_floor"] is None
    assert rows["dv"]["scale"] > 0 and rows["dv"]["abs_floor"] > 0
    inputs, config = make_inputs(get_case("masked_gates"))
    scales = diff_dump(inputs, config, resolve_impl("reference"), window=0).as_json()["scales"]
    assert scales["dqd"] == {"scale": None, "abs_floor": None, "per_cell": True, "weighted_by": "exp(gc)"}
    assert scales["o"]["per_cell"] is False
    assert scales["o"]["scale"] > 0


def test_a_nan_figure_is_not_shown_as_inf():
    inputs, config = make_inputs(get_case("basic"))
    for value, shown in ((float("nan"), "NaN"), (float("inf"), "inf")):
        res = check(inputs, config, impl=OneBadElement(value))
        o = res.as_json()["tensors"][0]
        assert o["ratio"] is None and o["max_abs"] is None and o["nonfinite"] == 1
        text = rendered(tables.render_run, res)
        assert "NaN/Inf one side" in text
        o_line = next(line for line in text.splitlines() if line.startswith("│ o "))
        assert "inf" not in o_line and o_line.count("—") == 2 and "FAIL" in o_line
        d = diff_dump(inputs, config, OneBadElement(value), names=(), window=0)
        text = rendered(difftables.render, d)
        assert "inf " not in text.replace(f"one-bad-element {shown}", "") and "ratio inf" not in text
        assert "1 element NaN/Inf on one side (no finite ratio" in text
        assert f"one-bad-element {shown}, reference" in text and "|diff| —" in text
        o_row = next(line for line in text.splitlines() if line.startswith("o "))
        assert "—" in o_row and "inf" not in o_row


def test_cosine_is_undefined_where_a_side_is_zero():
    from kdadbg.compare.metrics import compare

    z, one = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    for x, ref in ((z, z), (z, one), (one, z)):
        c = compare("t", x, ref)
        assert c.count == 4 and c.cosine != c.cosine        # NaN: undefined
    inputs, config = make_inputs(get_case("basic"))
    res = check(inputs, config, impl=OneBadElement("zeros"))
    assert res.as_json()["tensors"][0]["cosine"] is None
    o_line = next(line for line in rendered(tables.render_run, res).splitlines() if line.startswith("│ o "))
    assert "0.00000000" not in o_line and "—" in o_line
    d = diff_dump(inputs, config, OneBadElement("zeros"), names=(), window=0)
    assert all(c["cosine"] is None for c in d.as_json()["cells"] if c["tap"] == "o")
    assert d.first_divergence["cosine"] is None


def test_counts_of_one_are_singular():
    n = {"cells": 1, "elements": 1, "unrep": 1, "not_compared": 1, "ok": 0, "drift": 0, "bug": 0,
         "tap_cells": 1, "row_cells": 0}
    line = difftables.no_divergence(n, markup=False)
    assert "(1 cell over it" in line and "(1 cell, 1 element; 1 cell not compared)" in line
    assert "compared 1 cell (" in difftables.compared_line(n) and "; 1 cell not compared" in difftables.compared_line(n)
    assert "(0 cells not compared)" in difftables.no_divergence({**n, "cells": 0, "not_compared": 0}, markup=False)
    inputs, config = make_inputs(get_case("basic"))
    res = check(inputs, config, impl=resolve_impl("reference"))
    res.tensors = res.tensors[:1]
    assert "1 tensor within tolerance" in tables.run_verdict_line(res)


class _Float32Reference(Implementation):
    """The chunked reference itself in float32 (what a correct float32 implementation reaches), its dg scaled
    by ``dg_factor``."""

    def __init__(self, dg_factor=1.0, dA_log_factor=1.0):
        self.name, self.dg_factor, self.dA_log_factor = f"float32 reference, dg x{dg_factor:g}", dg_factor, dA_log_factor

    def run(self, inputs, config, *, device, taps=None):
        out = dict(run_reference(inputs, config, taps=(), device=device, dtype=torch.float32).outputs)
        out["dg"] = out["dg"] * self.dg_factor
        out["dA_log"] = out["dA_log"] * self.dA_log_factor
        return ImplRun(out)


def test_a_gradient_the_float32_reference_itself_cannot_hold_to_its_tolerance_is_unrep_as_a_whole():
    """User trial, round 40: on gates at the lower bound (chunk 32) the float32 reference's dg is 5.9e-5 from
    float64 against a tol of 1e-5; a float32 implementation as good as it had every dg cell UNREP in diff and
    yet "verdict: fail" (dg over tolerance as a whole), run "FAIL". A whole tensor within ten times its noise
    floor's own ratio, where that is over the tolerance, is UNREP (run and diff, with precision_floor); a dg
    50 % off still fails."""
    case = dataclasses.replace(get_case("strong_gates"), T=96, K=16, V=16, chunk_size=32)
    inputs, config = make_inputs(case, seed=0)
    res = check(inputs, config, impl=_Float32Reference())
    dg = next(t for t in res.tensors if t.name == "dg")
    assert dg.passed is False and dg.ratio > dg.tol and dg.precision_floor > dg.tol, (dg.ratio, dg.precision_floor)
    assert dg.unrep and "the reference in float32 (the noise floor) is ratio" in dg.unrep
    assert res.verdict == "pass" and "UNREP: dg ratio" in rendered(tables.render_run, res)
    assert res.as_json()["tensors"][5]["precision_floor"] == dg.precision_floor
    d = diff_dump(inputs, config, _Float32Reference(), window=0)
    assert d.verdict == "pass" and d.tensors["dg"]["unrep"] and d.tensors["dg"]["precision_floor"] > dg.tol
    bad = check(inputs, config, impl=_Float32Reference(1.5))
    dg = next(t for t in bad.tensors if t.name == "dg")
    assert bad.verdict == "fail" and dg.failed and dg.unrep is None and dg.precision_floor is not None
    assert diff_dump(inputs, config, _Float32Reference(1.5), window=0).verdict == "fail"


def test_a_tap_asked_for_by_name_and_not_provided_makes_the_diff_partial():
    """User trial, round 40: `diff --taps dS` of an implementation without taps said "taps it does not provide:
    dS" and "verdict: pass", exit 0: nothing compared what was asked for. Now partial, naming the tap (JSON
    taps_not_provided); with every tap asked by default, the same implementation passes."""
    inputs, config = make_inputs(get_case("basic"))
    fn = resolve_impl(f"{REPO / 'tests' / 'impls' / 'torch_kda.py'}:chunk_kda")
    res = diff_dump(inputs, config, fn, names=("dS",), window=0)
    assert res.verdict == "partial" and res.taps_not_provided == ["dS"]
    assert res.as_json()["taps_not_provided"] == ["dS"]
    assert "the taps asked for dS not provided" in rendered(difftables.render, res)
    assert diff_dump(inputs, config, fn, window=0).verdict == "pass"


def test_a_wrong_reduction_is_never_unrep_by_its_noise_floor():
    """Adversarial trial, round 40: dA_log 0.2 % off its own dg's sum on gates at the lower bound, where
    dA_log's float32 floor (2e-4) is over fp32's 1e-5: run relabelled the wrong sum UNREP (within 10x its
    floor) and passed, diff called it a BUG. dA_log and ddt_bias have the carried-in rule alone: a wrong sum
    fails in both."""
    case = dataclasses.replace(get_case("strong_gates"), T=96, K=16, V=16, chunk_size=32)
    inputs, config = make_inputs(case, seed=0)
    res = check(inputs, config, impl=_Float32Reference(dA_log_factor=1.002))
    da = next(t for t in res.tensors if t.name == "dA_log")
    assert res.verdict == "fail" and da.failed and da.unrep is None and da.precision_floor is None, (da.ratio, da.unrep)
    assert diff_dump(inputs, config, _Float32Reference(dA_log_factor=1.002), window=0).verdict == "fail"


class _BiasedDecayGradient(Implementation):
    """The float64 reference with head 1's dg moved by ``bias`` times its RMS, everywhere in one direction, and
    dA_log, ddt_bias formed exactly from that dg (their sums right): a bias in dg."""

    def __init__(self, bias):
        self.name, self.bias = f"reference, dg biased {bias:g}", bias

    def run(self, inputs, config, *, device, taps=None):
        from kdadbg.compare.carried import reductions_of

        out = {n: t.clone() for n, t in run_reference(inputs, config, taps=(), device=device).outputs.items()}
        dg = out["dg"]
        dg[:, :, 1] += self.bias * dg[:, :, 1].pow(2).mean().sqrt()
        sums = reductions_of(dg, inputs, config)
        out["dA_log"], out["ddt_bias"] = sums["dA_log"], sums["ddt_bias"]
        return ImplRun(out)


@pytest.mark.parametrize("precision, bias", [("fp32", 5e-4), ("bf16", 5e-3)])
def test_a_bias_in_dg_that_its_rows_cannot_show_is_not_carried_in(precision, bias):
    """Adversarial trial, round 40: dg biased by 5e-4 of its RMS on one head (its rows within ten times their
    float32 floor: UNREP), dA_log and ddt_bias formed from it: both passed as "carried in from dg" at fp32,
    though dA_log was 57x its own floor. dg's rounding errors cancel in the sums (coherence at most 7.8 measured),
    a bias adds up (82): past COHERENT (30) the sum is not excused, in run and in diff; a clean run passes.
    User trial, round 41: the same in bf16 mode, where dg within its 2e-2 (a dg missing each chunk's last
    token, 0.019) let a dA_log 14x its bar pass as carried in."""
    from kdadbg.compare.carried import COHERENT

    def impl(b):
        i = _BiasedDecayGradient(b)
        i.precision = precision
        return i

    inputs, config = make_inputs(dataclasses.replace(get_case("chunk64_strong"), T=512, H=4), seed=0)
    res = check(inputs, config, impl=impl(bias))
    dg, da = (next(t for t in res.tensors if t.name == n) for n in ("dg", "dA_log"))
    assert not dg.failed and da.tol == {"fp32": 1e-5, "bf16": 1e-2}[precision], (dg.ratio, da.tol)
    assert res.verdict == "fail" and da.failed and da.coherent > COHERENT, (da.ratio, da.coherent, da.carried)
    d = diff_dump(inputs, config, impl(bias), window=0)
    assert d.verdict == "fail" and any("sums into it coherently" in n for n in d.notes)
    assert bool(d.cells["dA_log"].failing[:, 1].all()), d.cells["dA_log"].label   # head 1's: BUG, never UNREP
    assert check(inputs, config, impl=impl(0.0)).verdict == "pass"


class _DroppedChunkLastToken(Implementation):
    """The float64 reference in bf16 mode with dg zeroed at each chunk's last token on head 1, in every
    sequence after the first (dA_log, ddt_bias formed exactly from that dg): the bug a user trial found."""

    def __init__(self, chunk_size):
        self.name, self.precision, self.C = "reference, dg's chunk-last tokens dropped", "bf16", chunk_size

    def run(self, inputs, config, *, device, taps=None):
        from kdadbg.compare.carried import reductions_of

        out = {n: t.clone() for n, t in run_reference(inputs, config, taps=(), device=device).outputs.items()}
        cu = inputs.cu_seqlens.tolist()
        for s, e in zip(cu[1:-1], cu[2:]):
            out["dg"][:, s + self.C - 1:e:self.C, 1] = 0
        sums = reductions_of(out["dg"], inputs, config)
        out["dA_log"], out["ddt_bias"] = sums["dA_log"], sums["ddt_bias"]
        return ImplRun(out)


def test_a_tensor_that_fails_whole_with_no_divergent_cell_says_where_to_look():
    """User trial, round 41: in bf16 mode a dg missing each chunk's last token (head 1, sequences after the
    first) read UNREP in every chunk it touched (the bf16 floor of dg ten times what kernels reach), and the
    diff said "no divergence" above "verdict: fail" from the whole-tensor rule, naming no chunk. The failing
    tensor's first cell over its tolerance is named, in the text and in the JSON (`tensors.dg.lead`)."""
    inputs, config = make_inputs(get_case("fla_layer_varlen"), seed=0)
    res = diff_dump(inputs, config, _DroppedChunkLastToken(config.chunk_size), window=0)
    assert res.verdict == "fail" and res.first_divergence is None and res.tensors_failing == ["dg"], res.counts()
    lead = res.tensor_lead("dg")
    seq_start = inputs.cu_seqlens.tolist()[1]
    assert lead["label"] == "UNREP" and lead["head"] == 1 and res.info.seq[lead["chunk"]] >= 1, lead
    assert res.info.start[lead["chunk"]] >= seq_start and lead["ratio"] > lead["tol"], lead
    text = " ".join(rendered(difftables.render, res).split())
    assert f"dg: cell furthest over its noise floor (every cell over its tolerance is UNREP): chunk {lead['chunk']}, head 1" in text, text
    doc = res.as_json()
    assert doc["tensors"]["dg"]["lead"]["chunk"] == lead["chunk"] and doc["tensors"]["o"]["lead"] is None


class _Oracle(Implementation):
    """The token-by-token float64 recurrence (kdadbg.oracle, gradients by autograd): NaN reaches exactly the
    tokens the recurrence carries it to; ``nan_o``: its o made NaN at that (token, head) too."""

    def __init__(self, nan_o=None):
        self.name, self.nan_o = "oracle", nan_o

    def run(self, inputs, config, *, device, taps=None):
        from kdadbg.oracle import run_oracle

        out = {n: t.detach().clone() for n, t in run_oracle(inputs, config).items()}
        if self.nan_o is not None:
            out["o"][:, self.nan_o[0], self.nan_o[1]] = float("nan")
        return ImplRun(out)


@pytest.mark.parametrize("token", [5, 70])
def test_a_nan_input_is_not_blamed_on_an_implementation_that_keeps_it_causal(tmp_path, token):
    """User trial, round 41: a NaN in one input token, captured with --when nonfinite: the chunked float64
    reference spreads it to the earlier tokens of its chunk (0 x NaN in the causal products), so a correct
    token-by-token implementation was a BUG at token 0 ("-7.3e-05, reference NaN") and diff and run failed.
    What a NaN/Inf input can reach in any chunking is left out on both sides (kdadbg.reach); before its
    64-token block o is still compared, and a NaN the implementation makes outside the reach still fails."""
    inputs, config = make_inputs(get_case("fla_layer"))
    v = inputs.v.clone()
    v[0, token, 0] = float("nan")
    inputs = dataclasses.replace(inputs, v=v)
    res = check(inputs, config, impl=_Oracle())
    o = next(t for t in res.tensors if t.name == "o")
    assert res.verdict == "pass" and res.nonfinite_inputs["agree"], [(t.name, t.ratio, t.nonfinite) for t in res.tensors]
    block = token // 64 * 64
    reached = 256 - block            # o of head 0 from the block on
    assert res.nonfinite_inputs["left_out"]["o"] == reached * 32 and o.count == (256 * 2 - reached) * 32, o.count
    assert "dv" not in res.nonfinite_inputs["left_out"]   # dv reads the state's gradient alone: not v
    assert any(n.startswith("left out as NaN/Inf inputs can reach them") for n in res.notes), res.notes
    d = diff_dump(inputs, config, _Oracle(), window=0)
    assert d.verdict == "pass" and d.counts()["bug"] == 0 and d.counts()["cells"] > 0, d.counts()
    # a NaN the implementation makes where no NaN input reaches (head 1): named, and the verdict fails
    bad = check(inputs, config, impl=_Oracle(nan_o=(3, 1)))
    assert bad.verdict == "fail" and not bad.nonfinite_inputs["agree"]
    d = diff_dump(inputs, config, _Oracle(nan_o=(3, 1)), window=0)
    assert d.verdict == "fail" and d.first_nonfinite["tap"] == "o" and d.first_nonfinite["head"] == 1


@pytest.mark.parametrize("token", [70, 100])
def test_a_nan_input_in_a_seeded_window_is_not_blamed_on_a_causal_implementation(token):
    """As above, in diff --chunks' seeded windows (without a reach built there, the chunked reference's spread
    within the NaN token's chunk would be compared against the token-by-token recurrence).
    The whole dump's reach bounds the window's; only the window's tokens count as left out."""
    inputs, config = make_inputs(get_case("fla_layer"))
    C, V = config.chunk_size, inputs.shape[4]
    v = inputs.v.clone()
    v[0, token, 0] = float("nan")
    inputs = dataclasses.replace(inputs, v=v)
    d = diff_dump(inputs, config, _Oracle(), chunks=(1, 3), seeded=True, window=0)
    assert d.verdict == "pass" and d.counts()["bug"] == 0 and d.counts()["cells"] > 0, d.counts()
    left = d.nonfinite_inputs["left_out"]
    first = max(token // 64 * 64, C)          # the window is tokens [C, 3C); o of head 0 reached from the block on
    assert left["o"] == (3 * C - first) * V and "dv" not in left, left
    bad = diff_dump(inputs, config, _Oracle(nan_o=(C + 3, 1)), chunks=(1, 3), seeded=True, window=0)
    assert bad.verdict == "fail" and bad.first_nonfinite["tap"] == "o" and bad.first_nonfinite["head"] == 1


class _WrongStateUpdate(Implementation):
    """The float64 reference returning no taps, its state update's ``kr`` with the exponent's sign flipped
    (``kn exp(gc - gT)``, a user trial's planted bug): every chunk writes the next state wrong, while each chunk's
    own products, seeded with the right state, are right."""

    def __init__(self):
        self.name = "reference, wrong state update"

    def run(self, inputs, config, *, device, taps=None):
        from unittest import mock

        from kdadbg import reference
        from kdadbg.impls.reference import Reference

        prepare = reference.fwd_prepare

        def wrong(x, scale):
            p = prepare(x, scale)
            return {**p, "kr": p["kd"] * torch.exp(-p["gT"])[:, :, None, :]}

        with mock.patch.object(reference, "fwd_prepare", wrong):   # this run only: the judge is not patched
            return ImplRun(Reference().run(inputs, config, device=device).outputs)


def test_a_wrong_state_update_without_taps_is_introduced_by_the_chunk_before():
    """User trial, round 45: an implementation without taps whose state update is wrong diverges first at o of
    chunk 1; the window rerun seeded chunk 1 with the reference's S, so o there was right ("inherited") and the
    rerun's own first divergence, one chunk on, read "tied to token positions, not carried in". With no S
    compared, the window now starts at the state update that wrote S[1], chunk 0: introduced there."""
    from rich.console import Console
    from kdadbg.render import difftables

    inputs, config = make_inputs(get_case("basic"))
    res = diff_dump(inputs, config, _WrongStateUpdate(), window=3)
    first, origin = res.first_divergence, res.origin
    assert (first["tap"], first["chunk"]) == ("o", 1) and "S" not in res.cells, first
    assert origin["verdict"] == "introduced" and origin["window"][0] == 0, origin
    console = Console(record=True, width=400)
    difftables._origin(console, origin)
    out = " ".join(console.export_text().split())
    assert "the fault is in chunk 1 itself, or in chunk 0's state update, which wrote the S entering it" in out, out
    assert "token positions" not in out, out
    # the tensors that fail whole are listed once; with a first BUG above, no per-tensor "start looking there"
    console = Console(record=True, width=400)
    difftables.render_tensors(console, res)
    out = " ".join(console.export_text().split())
    assert res.first_bug is not None and "over tolerance as whole tensors" in out and "start looking" not in out, out


def test_a_rerun_diverging_one_chunk_after_its_seed_is_said_to_carry_through_the_state():
    """The window's rerun diverging first at its second chunk is the first chunk to read a state the implementation
    wrote itself: a wrong state update carried through S, not a fault tied to token positions (user trial, round
    45); elsewhere in the window the position-tied reading stands."""
    from rich.console import Console
    from kdadbg.render import difftables

    base = {"window": [4, 6], "seq": 0, "seeded": {"h0": "reference S[4]", "dht": "reference dS[7]"},
            "verdict": "inherited", "tap": "o", "chunk": 4, "ratio": 1e-7, "label": "OK", "floor": 1e-7,
            "carried_by": None}
    for w_chunk, said, not_said in ((5, "a wrong state update, carried through S", "token positions"),
                                    (6, "tied to token positions", "carried through S")):
        w = {"tap": "o", "chunk": w_chunk, "head": 0, "label": "BUG", "ratio": 0.5, "token": None}
        console = Console(record=True, width=400)
        difftables._origin(console, {**base, "first_in_window": w})
        out = " ".join(console.export_text().split())
        assert said in out and not_said not in out.split("the window's rerun itself")[1], out


class _DAlogOff(Implementation):
    """The float64 reference, taps and all, with dA_log off by 1e-3 (relative): a per-head sum alone fails."""

    def __init__(self):
        self.name = "reference, dA_log off"

    def run(self, inputs, config, *, device, taps=None):
        from kdadbg.impls.reference import Reference

        got = Reference().run(inputs, config, device=device, taps=taps)
        return ImplRun({**got.outputs, "dA_log": got.outputs["dA_log"] * (1 + 1e-3)}, got.taps, got.tap_chunks,
                       got.tap_heads)


def test_the_window_reruns_moved_fault_is_a_bug_cell_with_a_chunk_never_noise_or_a_per_head_sum():
    """User trial 2: the window's rerun diverging first at dA_log (a per-head sum, no chunk) as DRIFT read "diverges
    first at dA_log chunk None, head 1 (DRIFT, ratio 1.427e-05): a fault that moves with where the run starts is
    tied to token positions". Only a BUG cell with a chunk is where a fault moved: the rerun names the window's
    first such cell (first_chunk_bug: a failing dA_log alone has none), and the text claims nothing else."""
    inputs, config = make_inputs(get_case("basic"))
    res = diff_dump(inputs, config, _DAlogOff(), window=0)
    assert res.first_divergence["tap"] == "dA_log" and res.first_divergence["chunk"] is None, res.first_divergence
    assert res.first_chunk_bug is None
    base = {"window": [3, 5], "seq": 2, "seq_start": True, "head": 1, "verdict": "inherited", "tap": "o", "chunk": 3,
            "ratio": 1.86e-07, "tol": 1e-05, "label": "OK", "floor": 2.18e-07,
            "seeded": {"h0": "reference S[3]", "dht": "no dht (the dump has none)"}}
    drift_head = {"tap": "dA_log", "kind": "head", "chunk": None, "head": 1, "token": None, "ratio": 1.427e-05,
                  "label": "DRIFT"}
    for w in (drift_head, {**drift_head, "label": "BUG"},
              {**drift_head, "tap": "o", "kind": "row", "chunk": 4, "token": 300}):   # a DRIFT o cell
        console = Console(record=True, width=400)
        difftables._origin(console, {**base, "first_in_window": w})
        out = " ".join(console.export_text().split())
        assert "None" not in out and "moves" not in out and "the window's rerun itself" not in out, out
    console = Console(record=True, width=400)
    difftables._origin(console, {**base, "first_in_window": {**drift_head, "tap": "o", "kind": "row", "chunk": 5,
                                                             "token": 300, "label": "BUG", "ratio": 0.5}})
    out = " ".join(console.export_text().split())
    assert ("the window's rerun itself has its first BUG at o chunk 5, head 1 (ratio 0.5, token 300): a fault that "
            "moves with where the run starts") in out, out


class _StatesTransposed(Implementation):
    """The float64 reference with ht (and dh0) returned transposed: [K,V] where the dump's are [V,K]."""

    def __init__(self):
        self.name = "reference, states transposed"

    def run(self, inputs, config, *, device, taps=None):
        out = {n: t.clone() for n, t in run_reference(inputs, config, taps=(), device=device).outputs.items()}
        for n in ("ht", "dh0"):
            if n in out:
                out[n] = out[n].transpose(-1, -2).contiguous()
        return ImplRun(out)


def test_states_returned_transposed_are_said_to_be():
    """User trial, round 41: a function returning ht as [K,V] on a [V,K] dump read "ht 1.409 FAIL" (run) and
    "BUG, introduced here" (diff), and nothing said "matches the reference transposed", as diff says of S/dS
    taps. Both now say it, naming the implementation; a clean run says nothing of it."""
    inputs, config = make_inputs(get_case("basic"))    # h0 and dht: ht and dh0 both compared, K = V
    res = check(inputs, config, impl=_StatesTransposed())
    assert res.verdict == "fail" and {t.name for t in res.tensors if t.failed} == {"ht", "dh0"}
    assert any(n.startswith("ht (ratio") and "dh0 (ratio" in n and "match the reference transposed" in n
               and "states transposed returns its states as [K,V]" in n for n in res.notes), res.notes
    d = diff_dump(inputs, config, _StatesTransposed(), names=(), window=0)
    assert d.verdict == "fail" and any("match the reference transposed" in n for n in d.notes), d.notes
    assert not any("transposed" in n for n in check(inputs, config, impl=resolve_impl("reference")).notes)


def test_the_exp_arguments_table_comes_only_with_a_nan_it_can_explain():
    """User trial, round 41: every diff of a strong-gate dump printed "exp arguments per chunk", one row per
    chunk, with no NaN/Inf anywhere. The table now comes with a first NaN/Inf only, and holds the chunks that
    overflow float32 and the NaN's own chunk."""
    inputs, config = make_inputs(get_case("fla_layer"))
    clean = diff_dump(inputs, config, resolve_impl("reference"), window=0)
    assert any(e["overflow_fp32"] for e in clean.exponents)     # the premise: exponents over 88.7
    assert clean.first_nonfinite is None and "exp arguments" not in rendered(difftables.render, clean)
    bad = diff_dump(inputs, config, NanOutput("o"), names=("gc",), window=0)
    text = " ".join(rendered(difftables.render, bad).split())
    flagged = [e["chunk"] for e in bad.exponents if e["overflow_fp32"]]
    assert bad.first_nonfinite is not None and f"{len(flagged)} chunks of {len(bad.exponents)} over it" in text, text


def test_the_grid_legend_explains_what_the_grid_shows():
    """User trial, round 41: every diff printed the same ~600-character legend, every symbol explained whether
    shown or not. It names the symbols in the grid only."""
    inputs, config = make_inputs(get_case("basic"))
    clean = difftables.grid_legend(diff_dump(inputs, config, resolve_impl("reference"), window=0).grid())
    assert "OK" in clean and "min tol" in clean and "DRIFT" not in clean and "unrep" not in clean
    assert "NaN/Inf" not in clean and len(clean) < 300, clean
    nan = difftables.grid_legend(diff_dump(inputs, config, NanOutput("o"), names=("gc",), window=0).grid())
    assert "BUG" in nan and "NaN/Inf on one side" in nan, nan


def test_without_colours_the_grid_and_the_per_head_line_show_the_labels():
    """User trial, round 46: piped into a log, a BUG cell of the grid was a bare figure like an OK one (its
    colour gone), and the legend spoke of italics and colours; the per-head line showed dA_log UNREP as a
    figure. Without colours a BUG cell reads "7e-1!", a DRIFT one "~", the legend says so, and the per-head
    line names every label but OK."""
    import io
    import math

    from rich.console import Console

    inputs, config = make_inputs(get_case("basic"))
    res = diff_dump(inputs, config, NanOutput("o"), names=("gc",), window=0)
    plain = Console(file=io.StringIO(), width=160, color_system=None)
    difftables.render_grid(plain, res)
    out = plain.file.getvalue()
    assert "! BUG: beyond" in out and "italic" not in out, out
    bug_cells = [c for row in res.grid()["rows"] for c in row["cells"] if c is not None and c["label"] == "BUG"
                 and c["ratio"] is not None and math.isfinite(c["ratio"])]
    assert all(f"{difftables.short(c['ratio'])}!" in out for c in bug_cells)
    coloured = Console(file=io.StringIO(), width=160, color_system="truecolor")
    difftables.render_grid(coloured, res)
    assert "! BUG" not in coloured.file.getvalue()
    from conftest import scaled_output

    inputs, config = make_inputs(get_case("kimi"))
    res = diff_dump(inputs, config, scaled_output(resolve_impl("reference"), "dA_log", 1.5), window=0)
    plain = Console(file=io.StringIO(), width=400, color_system=None)
    difftables.render_head_quantities(plain, res)
    line = plain.file.getvalue()
    assert "dA_log head 0 " in line and " BUG" in line and "ddt_bias head 0 " in line, line
    assert "ddt_bias head 0 " + difftables.short(res.cells["ddt_bias"].ratio[0, 0].item()) + "," in line, line


def test_a_per_head_unrep_cell_says_why_in_the_text():
    """User trial 2: "dA_log head 1 4e-2 UNREP" said nothing of why; the JSON had it (its noise floor 0.191 over
    tol 0.01). The per-head line gives the reason briefly: the floor over the tolerance, else the cell's reason."""
    import io
    from types import SimpleNamespace

    cells = [{"tap": "dA_log", "head": 0, "ratio": 4e-3, "tol": 1e-2, "floor": 1e-3, "label": "OK"},
             {"tap": "dA_log", "head": 1, "ratio": 3.6e-2, "tol": 1e-2, "floor": 0.1914, "label": "UNREP",
              "reason": "the compared precision cannot hold it to its tolerance: the noise floor (the reference at "
                        "that precision) is 0.191 > tol 0.01"},
             {"tap": "ddt_bias", "head": 0, "ratio": 5e-2, "tol": 8e-3, "floor": None, "label": "UNREP",
              "reason": "returned in 16 bits"},
             {"tap": "ddt_bias", "head": 1, "ratio": 5e-2, "tol": 8e-3, "floor": 1e-4, "label": "BUG"}]
    plain = Console(file=io.StringIO(), width=400, color_system=None)
    difftables.render_head_quantities(plain, SimpleNamespace(per_head_quantities=lambda: cells))
    line = plain.file.getvalue().strip()
    assert line == ("per-head gradients (every chunk): dA_log head 0 4e-3, dA_log head 1 4e-2 UNREP (noise floor "
                    "0.1914 > tol 1e-2), ddt_bias head 0 5e-2 UNREP (returned in 16 bits), ddt_bias head 1 5e-2 BUG"), line


def test_a_cell_passed_by_the_absolute_rule_is_marked_and_needs_no_tolerance():
    """User trial, round 46: a gT cell at 3e-4 against its 3e-5 showed as a plain OK figure, and min tol said
    0.00035 was needed: the cell passed by the absolute rule (max abs error 6e-10, within 1e-6 of gT's
    scale), which passes at any tolerance. The grid marks such a cell "°" (the legend says why) and min tol
    leaves it out."""
    import io

    from kdadbg.compare.metrics import passes
    from kdadbg.noise import OK

    inputs, config = make_inputs(get_case("basic"))
    res = diff_dump(inputs, config, resolve_impl("reference"), names=("gT",), window=0)
    c = res.cells["gT"]
    before = res.min_tolerance()["gT"]["min_tol"]
    c.ratio[1, 0], c.max_abs[1, 0] = 10 * c.tol, 0.0       # over its tolerance, within the absolute floor
    assert bool(passes(c.ratio, c.max_abs, c.nonfinite, c.tol, c.abs_floor)[1, 0]) and c.label[1, 0] == OK
    assert res.min_tolerance()["gT"]["min_tol"] == before   # not a tolerance anything needs
    out = Console(file=io.StringIO(), width=160, color_system=None)
    difftables.render_grid(out, res)
    text = out.file.getvalue()
    assert f"{difftables.short(10 * c.tol)}°" in text and "° OK over the tolerance" in text, text


def test_coherence_holds_for_errors_near_the_smallest_doubles():
    """User trial, round 46: a training step with gates near -1e16 left one ddt_bias column an error of 6e-302,
    whose square is 0: its coherence |sum e| / sqrt(sum e^2) came out inf (1.8e308), read as a bias in dg, and
    run failed ddt_bias. The ratio is at most sqrt(N); each group is scaled first."""
    from kdadbg.compare.carried import _coherent

    t = torch.zeros(64, 3, dtype=torch.float64)
    t[5, 0] = 6e-302                                     # one tiny error: coherence 1
    t[:, 1] = torch.randn(64, dtype=torch.float64)       # rounding-like: as the plain formula gives
    c = _coherent(t, (0,))
    assert c[0] == 1.0 and bool(torch.isnan(c[2])), c     # NaN: no error at all
    plain = t[:, 1].sum().abs() / t[:, 1].pow(2).sum().sqrt()
    assert torch.allclose(c[1], plain) and bool((c[:2] <= 8.0).all())


class _Bf16ProductsOff(Implementation):
    """The float32 reference with bf16 products (bf16 mode's noise model: a correct bf16 computation), its ``o``
    1 % off at chunk 7 (tokens 448-511), head 1."""

    precision = "bf16"

    def __init__(self):
        self.name = "bf16 products, o off at chunk 7"

    def run(self, inputs, config, *, device, taps=None):
        from kdadbg.impls.reference import Reference

        out = dict(Reference(dtype=torch.float32, dot_dtype=torch.bfloat16).run(inputs, config, device=device).outputs)
        out["o"] = out["o"].clone()
        out["o"][:, 448:512, 1] *= 1.01
        return ImplRun(out)


def test_a_failing_tensors_lead_is_not_a_noise_cell_ahead_of_the_fault():
    """Adversarial trial, round 41: the lead of o, failing whole, was chunk 5 head 0, an UNREP cell of bf16
    noise (UNREP in a clean run too), ahead of the fault at chunk 7 head 1 (DRIFT). The lead is the first cell
    over tolerance that is not UNREP."""
    inputs, config = make_inputs(dataclasses.replace(get_case("kimi_c64"), T=512), seed=0)
    res = diff_dump(inputs, config, _Bf16ProductsOff(), names=(), window=0)
    lead = res.tensor_lead("o")
    assert "o" in res.tensors_failing and (lead["chunk"], lead["head"], lead["lead"]) == (7, 1, "first"), lead


class _OracleTweaked(_Oracle):
    """The oracle with one output element scaled: ``(name, index, factor)``."""

    def __init__(self, tweak=None):
        super().__init__()
        self.tweak = tweak

    def run(self, inputs, config, *, device, taps=None):
        res = super().run(inputs, config, device=device, taps=taps)
        if self.tweak is not None:
            name, index, factor = self.tweak
            res.outputs[name][index] *= factor
        return res


@pytest.mark.parametrize("nan_in, token, tweak", [
    ("q", 5, ("o", (0, 200, 0), 1.1)),      # q is read, never written into the state: o after its block is finite
    ("v", 200, ("dk", (0, 3, 0), 1.5)),     # v is written into the state after token 200: dk before its block is not
])
def test_the_nan_reach_does_not_hide_what_no_nan_reaches(nan_in, token, tweak):
    """Adversarial trial, round 41: the first reach (the whole backward, and the forward from the NaN's block
    on, of its sequence and head) hid a wrong o after a NaN q and a wrong dk before a NaN v: run and diff passed.
    The reach follows what each input writes (the state, or its gradient) and reads; a clean oracle still
    passes, the wrong element fails both."""
    inputs, config = make_inputs(get_case("fla_layer"))
    t = getattr(inputs, nan_in).clone()
    t[0, token, 0] = float("nan")
    inputs = dataclasses.replace(inputs, **{nan_in: t})
    assert check(inputs, config, impl=_OracleTweaked()).verdict in ("pass", "partial")
    assert diff_dump(inputs, config, _OracleTweaked(), window=0).verdict in ("pass", "partial")
    res = check(inputs, config, impl=_OracleTweaked(tweak))
    assert res.verdict == "fail" and [t.name for t in res.tensors if t.failed] == [tweak[0]], res.tensors
    assert diff_dump(inputs, config, _OracleTweaked(tweak), window=0).verdict == "fail"


def test_a_nan_input_is_not_blamed_in_a_chunks_window_either():
    """Adversarial trial, round 41: run --chunks built no reach, so the reference's NaN before a NaN v (tokens
    64-99 of the window's chunk) failed a correct token recurrence again (576 one-sided NaN in o). The window's
    comparison leaves the reach out as the whole run's does."""
    inputs, config = make_inputs(get_case("chunk64"))
    v = inputs.v.clone()
    v[0, 100, 0] = float("nan")
    inputs = dataclasses.replace(inputs, v=v)
    res = check(inputs, config, impl=_Oracle(), chunks=(1, 2))
    assert res.verdict in ("pass", "partial") and res.nonfinite_inputs["left_out"], \
        ([(t.name, t.nonfinite, t.passed) for t in res.tensors], res.notes)
