"""The Implementation seam (``--impl``): a user's function with fla's ``chunk_kda`` convention
(``tests/impls/torch_kda.py``) runs through ``run`` and ``diff``; planted faults are named exactly
(quantity, chunk, head, origin) with no taps at all; ``--impl reference`` passes with ratio 0; an
outputs-only taps file is compared per chunk; nothing compared is an error, never a pass."""

import dataclasses
import json
import time

import pytest
import torch

from kdadbg.noise import DRIFT, UNREP
from kdadbg.compare.result import unrep_reason
from typer.testing import CliRunner

from kdadbg import cli
from kdadbg.cases import CASES, get_case, make_inputs
from kdadbg.chunks import chunk_table
from kdadbg.diff import diff_dump
from kdadbg.dump import save_dump
from kdadbg.errors import KdadbgError
from kdadbg.impls import Implementation, ImplRun, TapsSpec, resolve_impl
from kdadbg.impls.function import Function
from kdadbg.reference import run_reference
from kdadbg.run import check
from kdadbg.tapsfile import chunk_rows, taps_metadata, write_taps_file
from kdadbg.tolerances import tolerances
from conftest import REPO

IMPL = str(REPO / "tests" / "impls" / "torch_kda.py")
runner = CliRunner()


def impl(fn="chunk_kda", precision="fp32"):
    return resolve_impl(f"{IMPL}:{fn}", precision)


def case_inputs(name, seed=0, **kw):
    case = dataclasses.replace(get_case(name), **kw) if kw else get_case(name)
    return make_inputs(case, seed=seed)


def marked(name, chunk, head, **kw):
    """A dump with the fault mark (beta = 7.0) on the first token of global chunk ``chunk``, head ``head``."""
    from tests.impls.torch_kda import plant_mark

    inputs, config = case_inputs(name, **kw)
    B, T, H, K, V = inputs.shape
    ct = chunk_table(B, T, inputs.cu_seqlens, config.chunk_size)
    inputs = dataclasses.replace(inputs, beta=plant_mark(inputs.beta, int(ct.start[chunk]), head))
    return inputs, config


@pytest.mark.parametrize("case", [pytest.param(c.name, id=c.name) for c in CASES])
def test_user_function_passes_the_case_table(case):
    inputs, config = case_inputs(case)
    # bf16 dumps: the function returns o in bf16, judged at bf16 tolerances
    res = diff_dump(inputs, config, impl(precision="bf16" if get_case(case).dtype == "bfloat16" else "fp32"),
                    window=0)
    assert res.passed and res.first_divergence is None
    n = res.counts()
    assert n["row_cells"] > 0 and n["cells"] == n["ok"] + n["unrep"]


def test_bf16_outputs_judged_at_fp32_point_to_the_bf16_precision():
    """A function that returns bf16 outputs, diffed at fp32: most rows are UNREP (fp32's tolerances cannot
    judge them) and a note names the bf16 outputs and --precision bf16; at bf16 every row is judged."""
    inputs, config = case_inputs("bf16")
    res = diff_dump(inputs, config, impl(), window=0)
    n = res.counts()
    hint = [x for x in res.notes if "--precision bf16" in x]
    assert res.passed and 2 * n["unrep"] > n["row_cells"] > 0
    assert hint == [f"{n['unrep']} of {n['row_cells']} output/gradient cells are UNREP: {impl().name} returns "
                    f"o, dq, dk, dv, dg, dbeta, dh0 in bfloat16 (a gradient comes back in its input's dtype, "
                    f"whatever the function computed in), values that fp32's tolerances cannot judge; "
                    f"--precision bf16 judges them at bf16's"]
    res = diff_dump(inputs, config, impl(precision="bf16"), window=0)
    assert res.counts()["ok"] == res.counts()["cells"] > 0
    assert not [x for x in res.notes if "--precision bf16" in x]


def test_run_of_bf16_outputs_at_fp32_is_unrep_where_their_rounding_explains_them(tmp_path):
    """kdadbg run of a function that returns bf16 outputs, at fp32: a tensor over fp32's tolerance by what
    bf16's rounding gives is judged at bf16 mode's tolerance instead, UNREP within it (not a failure; the
    JSON says why), the rest judged as ever; an error in the same function over bf16's tolerance (o 1 %
    off, and every gradient with it) still fails, the line naming --precision bf16; at bf16 every tensor is
    judged."""
    off = tmp_path / "off.py"
    off.write_text("import sys\nsys.path.insert(0, %r)\nfrom tests.impls.torch_kda import chunk_kda as _k\n\n"
                   "def o_off(*a, **k):\n    o, ht = _k(*a, **k)\n    return o * 1.01, ht\n" % str(REPO))
    inputs, config = case_inputs("bf16")
    res = check(inputs, config, impl=impl())
    unrep = {t.name: t for t in res.tensors if t.unrep}
    assert res.passed and set(unrep) == {"o", "dq", "dk", "dv", "dg", "dbeta", "dh0"}
    bf16_tols = tolerances("bf16")
    assert all(not t.passed and t.tol < t.floor and t.ratio <= bf16_tols[n] for n, t in unrep.items())
    assert {t.name for t in res.tensors if t.passed} == {"ht", "dA_log", "ddt_bias"}
    doc = res.as_json()
    assert doc["verdict"] == "pass" and doc["tensors"][0]["unrep"].startswith("returned in bfloat16, whose")
    res = check(inputs, config, impl=resolve_impl(f"{off}:o_off", "fp32"))
    o = [t for t in res.tensors if t.name == "o"][0]
    assert not res.passed and not o.passed and not o.unrep and o.tol < o.floor < bf16_tols["o"] < o.ratio
    res = check(inputs, config, impl=impl(precision="bf16"))
    assert res.passed and all(t.passed and not t.unrep for t in res.tensors)
    dump = save_dump(tmp_path / "b.safetensors", inputs, config)
    r = runner.invoke(cli.app, ["run", str(dump), "--impl", f"{IMPL}:chunk_kda"])
    assert r.exit_code == 0 and "PASS: 3 tensors within tolerance, 7 UNREP (o, dq, dk, dv, dg, dbeta, dh0)" in r.stdout
    assert "returned in bfloat16 (a gradient comes back in its input's dtype), whose rounding alone is ratio" \
        in " ".join(r.stdout.split()), r.stdout
    r = runner.invoke(cli.app, ["run", str(dump), "--impl", f"{off}:o_off"])
    assert r.exit_code == 1 and "FAIL: o, dq, dh0, dA_log, ddt_bias over tolerance" in r.stdout
    assert "--precision bf16 is the mode" in r.stdout


def test_run_of_a_user_function_passes_and_adds_little_time():
    from kdadbg.dump import load_dump

    inputs, config = load_dump(REPO / "sample_inputs" / "basic.safetensors")
    t0 = time.perf_counter()
    res = check(inputs, config, impl=impl())
    total = time.perf_counter() - t0
    assert res.passed and res.elements > 0 and not res.not_provided
    own = res.timings[impl().name]
    assert total - own < 1.0, f"kdadbg added {total - own:.2f} s over the function's {own:.2f} s"


@pytest.mark.parametrize("fault, case, chunk, head, want, origin", [
    pytest.param("fwd_fault", "zero_gates", 2, 1, ("o", 2), "introduced", id="forward-error"),
    pytest.param("bwd_fault", "zero_gates", 1, 0, ("dk", 1), "introduced", id="backward-only-error"),
    # the state leaving chunk 1 wrong: o of chunk 2 diverges first; no S compared (a function without taps), the
    # window starts at chunk 1, whose state update wrote it, and finds the fault there (a window seeded at chunk 2
    # would read "inherited")
    pytest.param("state_fault", "zero_gates", 1, 1, ("o", 2), "introduced", id="state-carried-wrongly"),
    pytest.param("fwd_fault", "varlen", 9, 2, ("o", 9), "introduced", id="forward-error-varlen"),
    # the state's gradient wrong on its way back into chunk 2: chunks 0-2's gradients and dh0 all fail; the
    # backward walks chunk 2 first (user trial, round 39: it named dh0 at chunk 0, the walk's end)
    pytest.param("dstate_fault", "zero_gates", 2, 1, ("dv", 2), "introduced", id="state-gradient-carried-back"),
])
def test_planted_fault_is_named_exactly(fault, case, chunk, head, want, origin):
    inputs, config = marked(case, chunk, head)
    clean = diff_dump(inputs, config, impl(), window=0)
    assert clean.passed and clean.first_divergence is None
    res = diff_dump(inputs, config, impl(fault))
    first = res.first_divergence
    assert (first["tap"], first["chunk"], first["head"]) == (*want, head)
    assert first["label"] == "BUG" and not res.passed
    assert res.origin["verdict"] == origin
    if fault == "state_fault":   # the window from the marked chunk, whose state update is wrong
        assert res.origin["window"][0] == chunk, res.origin["window"]


@pytest.mark.parametrize("fault, case, chunk, head, want, origin", [
    pytest.param("fwd_fault", "gva", 1, 3, ("o", 1, 3), "introduced", id="gva-forward-error-value-head"),
    pytest.param("bwd_fault", "gva", 1, 3, ("dk", 1, 1), "introduced", id="gva-backward-error-qk-head"),
    pytest.param("state_fault", "gva_varlen", 2, 2, ("o", 3), "introduced", id="gva-varlen-state-carried"),
])
def test_gva_planted_fault_is_named_on_its_head(fault, case, chunk, head, want, origin):
    """GVA: a fault on value head 3 shows in o of value head 3, or in dk of the q/k head 1 that value
    heads 2 and 3 share (reported with those value heads); the window rerun follows the group."""
    inputs, config = marked(case, chunk, head)
    assert inputs.group > 1
    res = diff_dump(inputs, config, impl(fault))
    first = res.first_divergence
    got = (first["tap"], first["chunk"], first["head"])
    assert got == (want if len(want) == 3 else (*want, head)), got
    if first["tap"] == "dk":
        assert first["value_heads"] == [2, 3] and res.cells["dk"].heads == [0, 1]
        # the amplification of dk is on that q/k head, named with its value heads (it said "head 1")
        amp = next(a for a in res.amplification if a["tap"] == "dk")
        assert amp["head"] == 1 and amp["value_heads"] == [2, 3], amp
    else:
        assert "value_heads" not in first
    assert first["label"] == "BUG" and not res.passed
    assert res.origin["verdict"] == origin
    if fault == "state_fault":
        assert res.origin["window"][0] == chunk, res.origin["window"]


def test_wrong_varlen_offset_of_the_second_sequence_is_named():
    inputs, config = case_inputs("varlen_short")
    res = diff_dump(inputs, config, impl("varlen_fault"))
    first = res.first_divergence
    ct = chunk_table(*inputs.shape[:2], inputs.cu_seqlens, config.chunk_size)
    assert (first["tap"], first["chunk"], first["seq"]) == ("o", int(ct.seq_chunk_base[1]), 1)
    assert not res.passed


def test_forward_only_reports_gradients_not_provided(tmp_path):
    inputs, config = case_inputs("basic")
    res = check(inputs, config, impl=impl("forward_only"))
    assert res.verdict == "partial" and not res.passed and [t.name for t in res.tensors] == ["o", "ht"]
    assert set(res.not_provided) == {"dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias"}
    d = diff_dump(inputs, config, impl("forward_only"), window=0)
    assert d.verdict == "partial" and not d.passed and set(d.cells) == {"o", "ht"} and "dq" in d.not_provided
    assert d.first_divergence is None
    from kdadbg.render.plot import diff_plot_data
    assert "PARTIAL (not a full pass): dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias not provided" in diff_plot_data(d)["no_divergence"]
    path = tmp_path / "d.safetensors"
    save_dump(path, inputs, config)
    r = runner.invoke(cli.app, ["run", str(path), "--impl", f"{IMPL}:forward_only"])
    assert r.exit_code == 3, r.output            # PARTIAL: not a full pass
    assert "not provided" in r.output and "PARTIAL" in r.output and "PASS" not in r.output
    r = runner.invoke(cli.app, ["diff", str(path), "--impl", f"{IMPL}:forward_only", "--window", "0"])
    assert r.exit_code == 3, r.output            # diff too: verdict partial
    assert "verdict: partial" in r.output and "dq" in r.output


def test_reference_against_itself_is_exact():
    inputs, config = case_inputs("varlen_kv")
    res = diff_dump(inputs, config, resolve_impl("reference"))
    assert res.passed
    assert all(float(c.ratio.max()) == 0.0 for c in res.cells.values())
    assert {"S", "dS", "dgc", "o", "dk", "ddt_bias"} <= set(res.cells)
    run = check(inputs, config, impl=resolve_impl("reference"))
    assert run.passed and all(t.ratio == 0.0 for t in run.tensors)


def _outputs_only_file(tmp_path, inputs, config, perturb=None):
    """fla's outputs and gradients of a training step, as a taps file with no taps: here the float32
    reference's, with ``dk`` of one chunk × head perturbed by 1e-3."""
    res = run_reference(inputs, config, taps=(), dtype=torch.float32)
    outs = {n: t.clone() for n, t in res.outputs.items()}
    if perturb is not None:
        chunk, head = perturb
        ct = res.chunks
        flat = outs["dk"].view(-1, *outs["dk"].shape[2:])
        s, n = int(ct.start[chunk]), int(ct.length[chunk])
        flat[s:s + n, head] += 1e-3
    path = tmp_path / ("theirs_bad.safetensors" if perturb else "theirs.safetensors")
    write_taps_file(path, outs, {}, chunk_rows(res.chunks, 0, 0), [], taps_metadata("fla", "d", config))
    return path


def test_outputs_only_file_is_compared_per_chunk(tmp_path):
    inputs, config = case_inputs("basic")
    dump = tmp_path / "d.safetensors"
    save_dump(dump, inputs, config)
    good = _outputs_only_file(tmp_path, inputs, config)
    r = runner.invoke(cli.app, ["diff", str(dump), "--against", str(good), "--json", str(tmp_path / "g.json")])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["verdict"] == "pass" and doc["compared"]["cells"] > 0 and doc["compared"]["row_cells"] > 0
    assert doc["impl"]["kind"] == "taps file"
    bad = _outputs_only_file(tmp_path, inputs, config, perturb=(4, 1))
    r = runner.invoke(cli.app, ["diff", str(dump), "--against", str(bad), "--json", str(tmp_path / "b.json")])
    assert r.exit_code == 1, r.output
    first = json.loads((tmp_path / "b.json").read_text())["first_divergence"]
    assert (first["tap"], first["chunk"], first["head"]) == ("dk", 4, 1)
    assert "not available" in r.output   # a taps file cannot be rerun


def test_a_file_that_provides_nothing_is_exit_2(tmp_path):
    inputs, config = case_inputs("basic")
    dump = tmp_path / "d.safetensors"
    save_dump(dump, inputs, config)
    from kdadbg.fileio import atomic_save
    other = tmp_path / "other.safetensors"
    atomic_save({"unrelated": torch.zeros(3)}, {}, other)
    for against, fragment in ((other, "nothing to compare"), (dump, "is a dump")):
        r = runner.invoke(cli.app, ["diff", str(dump), "--against", str(against)])
        assert r.exit_code == 2, r.output
        assert fragment in r.output


class _Unsupported(Implementation):
    name = "needs128"

    def supports(self, config, shapes):
        return (shapes["K"] == 128, f"needs K = V = 128, found K={shapes['K']}")


def test_unsupported_dump_is_refused_before_any_work():
    inputs, config = case_inputs("basic")
    with pytest.raises(KdadbgError, match="needs K = V = 128, found K=16"):
        check(inputs, config, impl=_Unsupported())


def test_function_that_raises_is_one_line_exit_1(tmp_path):
    mod = tmp_path / "boom.py"
    mod.write_text("def chunk_kda(q, k, v, g, beta, **kw):\n    raise RuntimeError('CUDA error: illegal memory access')\n"
                   "def wrong_shape(q, k, v, g, beta, **kw):\n    return q[..., :1], None\n"
                   "def needs_flag(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):\n"
                   "    return v, None\n"
                   "def four_pos(q, k, v, g, *, beta=None, **kw):\n    return v, None\n")
    inputs, config = case_inputs("basic")
    dump = tmp_path / "d.safetensors"
    save_dump(dump, inputs, config)
    r = runner.invoke(cli.app, ["run", str(dump), "--impl", f"{mod}:chunk_kda"])
    assert r.exit_code == 1 and "raised RuntimeError: CUDA error" in r.output and "Traceback" not in r.output
    r = runner.invoke(cli.app, ["run", str(dump), "--impl", f"{mod}:chunk_kda", "--traceback"])
    assert r.exit_code == 1 and "Traceback" in r.output
    r = runner.invoke(cli.app, ["run", str(dump), "--impl", f"{mod}:wrong_shape"])
    assert r.exit_code == 2 and "output 'o': expected shape [2,40,2,16]" in r.output
    r = runner.invoke(cli.app, ["run", str(dump), "--impl", f"{mod}:needs_flag"])
    assert r.exit_code == 2 and "use_gate_in_kernel=True" in r.output and "takes none of these arguments" in r.output
    # a signature the call cannot bind is a refusal (exit 2), not the function raising (exit 1; user trial, round 46)
    r = runner.invoke(cli.app, ["run", str(dump), "--impl", f"{mod}:four_pos"])
    assert r.exit_code == 2 and "which its signature refuses: too many positional arguments" in r.output, r.output
    r = runner.invoke(cli.app, ["run", str(dump), "--impl", f"{mod}:nope"])
    assert r.exit_code == 2 and "has no 'nope'" in r.output
    # names that are emoji codes stay names (":x:" and ":three:" were drawn as emoji, round 38)
    for name in ("x", "three"):
        r = runner.invoke(cli.app, ["run", str(dump), "--impl", f"{mod}:{name}"])
        assert r.exit_code == 2 and f"{mod}:{name}: " in r.stderr and f"has no '{name}'" in r.stderr, r.stderr


def test_a_function_without_its_final_state_is_told_that_dht_went_nowhere(tmp_path):
    """User trial, round 38: a function returning (o, None) on a dump with dht failed dk, dv, dg, dbeta and diff
    named dv's chunk as introduced there, sending the user into their backward; now run and diff say first
    that the dump's dht had nowhere to go. Without dht in the dump, no such note."""
    (tmp_path / "noht.py").write_text(f"import importlib.util\nspec = importlib.util.spec_from_file_location('t', "
                                      f"{IMPL!r})\nm = importlib.util.module_from_spec(spec)\n"
                                      f"spec.loader.exec_module(m)\n"
                                      f"def f(q, k, v, g, beta, **kw):\n    return m.chunk_kda(q, k, v, g, beta, **kw)[0], None\n")
    fn = f"{tmp_path / 'noht.py'}:f"
    for name, noted in (("basic", True), ("h0_only", False)):
        inputs, config = case_inputs(name)
        dump = tmp_path / f"{name}.safetensors"
        save_dump(dump, inputs, config)
        for command in (["run"], ["diff", "--window", "0"]):
            r = runner.invoke(cli.app, [command[0], str(dump), "--impl", fn, *command[1:]])
            assert ("the dump's dht was not applied" in r.stdout) == noted, (name, command, r.stdout)
            assert "returned no final state" in r.stdout or not noted


def test_taps_files_and_returned_taps_are_checked_or_said_unchecked(tmp_path):
    """User trial, round 38: a taps file's head.index 7 (of 2 heads) was dropped without a word, a tap.bogus
    ignored silently, and run passed a function's malformed taps as if it had looked at them."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    inputs, config = case_inputs("basic")
    dump = tmp_path / "d.safetensors"
    save_dump(dump, inputs, config)
    good = tmp_path / "ref.safetensors"
    assert runner.invoke(cli.app, ["taps", str(dump), "-o", str(good), "--taps", "S,dS"]).exit_code == 0
    with safe_open(str(good), "pt") as f:
        meta = f.metadata()
    t = load_file(str(good))
    bad_head = dict(t, **{"head.index": torch.tensor([0, 7], dtype=t["head.index"].dtype)})
    save_file(bad_head, str(tmp_path / "badhead.safetensors"), metadata=meta)
    r = runner.invoke(cli.app, ["diff", str(dump), "--against", str(tmp_path / "badhead.safetensors")])
    assert r.exit_code == 2 and "head.index 7 out of range; the dump has 2 value heads" in r.stderr, r.output
    save_file(dict(t, **{"tap.bogus": torch.zeros(3)}), str(tmp_path / "bogus.safetensors"), metadata=meta)
    r = runner.invoke(cli.app, ["diff", str(dump), "--against", str(tmp_path / "bogus.safetensors"), "--window", "0"])
    assert r.exit_code == 0 and "not read: tap.bogus" in r.stdout, r.output
    (tmp_path / "withtaps.py").write_text(
        f"import importlib.util, torch\nspec = importlib.util.spec_from_file_location('t', {IMPL!r})\n"
        f"m = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(m)\n"
        f"def f(q, k, v, g, beta, **kw):\n    o, ht = m.chunk_kda(q, k, v, g, beta, **kw)\n"
        f"    return o, ht, {{'S': torch.zeros(3, 3)}}\n")
    r = runner.invoke(cli.app, ["run", str(dump), "--impl", f"{tmp_path / 'withtaps.py'}:f"])
    assert r.exit_code == 0 and "returned taps; run compares outputs and gradients only" in r.stdout, r.output
    r = runner.invoke(cli.app, ["diff", str(dump), "--impl", f"{tmp_path / 'withtaps.py'}:f", "--window", "0"])
    assert r.exit_code == 2 and "tap 'S'" in r.stderr, r.output
    # a tensor of the user's own beside the taps is named and left out, not the end of the diff (round 46)
    (tmp_path / "extra.py").write_text(
        f"import importlib.util, torch\nspec = importlib.util.spec_from_file_location('t', {IMPL!r})\n"
        f"m = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(m)\n"
        f"def f(q, k, v, g, beta, **kw):\n    o, ht = m.chunk_kda(q, k, v, g, beta, **kw)\n"
        f"    return o, ht, {{'Sfoo': torch.zeros(3, 3), 'dgC': torch.zeros(1)}}\n")
    r = runner.invoke(cli.app, ["diff", str(dump), "--impl", f"{tmp_path / 'extra.py'}:f", "--window", "0"])
    assert r.exit_code == 0 and "verdict: pass" in r.stdout, r.output
    assert "returned taps kdadbg does not know, not compared: Sfoo, dgC (did you mean dgc?)" in \
        " ".join(r.stdout.split()), r.stdout


def test_an_implementation_that_exits_or_fails_to_import(tmp_path):
    """User trial, round 38: a function calling sys.exit(0) made run, diff and taps exit 0 with no verdict; a
    module exiting at import gave its own code (3 read as partial); a file whose import raised was exit 1 (a
    numerical failure) and a folder named as the file "no such file". Now: one line each, exit 1 for what the
    function does when called, 2 for a file that cannot be imported; a module parsing its command line at
    import sees none (it parsed kdadbg's)."""
    (tmp_path / "fexit.py").write_text("import sys\ndef chunk_kda(q, k, v, g, beta, **kw):\n    sys.exit(0)\n")
    (tmp_path / "modexit.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "imperr.py").write_text("import nonexistent_module_of_a_user\n")
    (tmp_path / "syn.py").write_text("def f(:\n")
    (tmp_path / "argp.py").write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--bs', "
                                      "type=int, default=4)\nargs = p.parse_args()\n"
                                      "def chunk_kda(q, k, v, g, beta, **kw):\n    raise RuntimeError('ran')\n")
    (tmp_path / "adir.py").mkdir()
    inputs, config = case_inputs("basic")
    dump = tmp_path / "d.safetensors"
    save_dump(dump, inputs, config)
    for command in (["run"], ["diff"], ["taps", "-o", str(tmp_path / "t.safetensors")]):
        r = runner.invoke(cli.app, [command[0], str(dump), *command[1:], "--impl" if command[0] != "taps" else
                                    "--source", f"{tmp_path / 'fexit.py'}:chunk_kda"])
        assert r.exit_code == 1 and "called sys.exit(0) instead of returning" in r.stderr, (command, r.output)
    assert not (tmp_path / "t.safetensors").exists()
    for name, code, fragment in (("modexit", 2, "importing"), ("imperr", 2, "raised ModuleNotFoundError"),
                                 ("syn", 2, "raised SyntaxError"), ("argp", 1, "raised RuntimeError: ran"),
                                 ("adir", 2, "is a folder, expected a Python file")):
        r = runner.invoke(cli.app, ["run", str(dump), "--impl", f"{tmp_path / name}.py:chunk_kda"])
        assert r.exit_code == code and fragment in r.stderr and "Traceback" not in r.output, (name, r.output)
    r = runner.invoke(cli.app, ["run", str(dump), "--impl", f"{tmp_path / 'modexit.py'}:chunk_kda"])
    assert "called sys.exit(3)" in r.stderr, r.output


class _WithTaps(Implementation):
    """An implementation whose taps come in FlashKDA-like conventions ([V,K] states, log2 gates)."""
    name = "vk-log2"
    provides_taps = True

    def run(self, inputs, config, *, device, taps=None):
        res = run_reference(inputs, config, taps=("S", "gc", "dgc"), dtype=torch.float32)
        theirs = {"S": res.taps["S"].transpose(-1, -2), "gc": res.taps["gc"] / 0.6931471805599453,
                  "dgc": res.taps["dgc"] * 0.6931471805599453}
        f = Function(lambda *a, **k: None, "x")
        run = ImplRun(res.outputs)
        from kdadbg.impls.base import convert_taps
        conv = convert_taps(theirs, TapsSpec("vk", "log2"))
        run.taps, run.tap_chunks, run.tap_heads = conv, list(range(res.chunks.n_chunks)), list(range(inputs.shape[2]))
        del f
        return run


def test_taps_in_another_convention_are_converted():
    inputs, config = case_inputs("k_ne_v")
    res = diff_dump(inputs, config, _WithTaps(), names=("S", "gc", "dgc"), window=0)
    assert res.passed and {"S", "gc", "dgc"} <= set(res.cells)
    assert res.counts()["tap_cells"] > 0


def test_help_names_impl():
    for cmd in ("run", "diff", "taps"):
        r = runner.invoke(cli.app, [cmd, "--help"])
        assert "--impl" in r.output, cmd


def test_readme_example_implementation_passes(tmp_path):
    text = (REPO / "README.md").read_text()
    code = text.split("A 20-line implementation")[1].split("```python")[1].split("```")[0]
    (tmp_path / "mine.py").write_text(code)
    for case in ("basic", "strong_gates", "beta_high"):   # sigma at 1: its gradient must keep its digits
        inputs, config = case_inputs(case)
        res = check(inputs, config, impl=resolve_impl(f"{tmp_path / 'mine.py'}:chunk_kda"))
        assert res.passed and not res.not_provided, case
    vin, vcfg = case_inputs("varlen_short")
    with pytest.raises(KdadbgError, match="needs cu_seqlens"):
        check(vin, vcfg, impl=resolve_impl(f"{tmp_path / 'mine.py'}:chunk_kda"))


class _Bf16Storage(Implementation):
    """The float32 reference, its o and its S taps stored in bf16 (as FlashKDA stores kd, S, ...)."""
    name = "bf16-storage"
    provides_taps = True

    def __init__(self, declare=True):
        self.declare = declare

    def run(self, inputs, config, *, device, taps=None):
        res = run_reference(inputs, config, taps=("S", "U"), dtype=torch.float32)
        outs = dict(res.outputs)
        outs["o"] = outs["o"].to(torch.bfloat16)
        t = {"S": res.taps["S"].to(torch.bfloat16).float(), "U": res.taps["U"]}
        run = ImplRun(outs, t, list(range(res.chunks.n_chunks)), list(range(inputs.shape[2])))
        if self.declare:
            run.tap_storage = {"S": torch.bfloat16}
        return run


def test_values_stored_in_16_bits_are_judged_against_a_floor_that_rounds_too():
    inputs, config = case_inputs("t200")
    res = diff_dump(inputs, config, _Bf16Storage(), names=("S", "U"), window=0)
    assert res.passed and res.first_bug is None
    # bf16 storage against fp32 tolerances: the rounding floor is over the tolerance, so the cells are UNREP
    # (the compared precision cannot hold them), never a divergence
    for n in ("o", "S"):
        assert bool((res.cells[n].label == UNREP).all()), n
        assert "cannot hold it to its tolerance" in unrep_reason(res.cells[n], 0, 0)
    assert res.first_divergence is None
    undeclared = diff_dump(inputs, config, _Bf16Storage(declare=False), names=("S", "U"), window=0)
    assert undeclared.first_bug["tap"] == "S" and not undeclared.passed    # a rounding nobody declared is a bug


class _TwiceRounded(Implementation):
    """The float32 reference with its ki taps off by 1.5 bf16 half-ulps and then stored in bf16 (FlashKDA's
    ki on lower-bound dumps is 5.3e-3 from float64), its S stored in bf16, ``plant``: S of that chunk x 1.05."""
    name = "ki-twice-rounded"
    provides_taps = True
    precision = "bf16"

    def __init__(self, plant=None):
        self.plant = plant

    def run(self, inputs, config, *, device, taps=None):
        res = run_reference(inputs, config, taps=("ki", "S"), dtype=torch.float32)
        ki = res.taps["ki"]
        sign = torch.randint(0, 2, ki.shape, generator=torch.Generator().manual_seed(0)).to(ki.dtype) * 2 - 1
        t = {"ki": (ki * (1 + 1.5 * 2.0 ** -8 * sign)).to(torch.bfloat16).float(),
             "S": res.taps["S"].to(torch.bfloat16).float()}
        if self.plant is not None:
            t["S"][self.plant] *= 1.05
        outs = {n: x.to(torch.bfloat16) if n == "o" else x for n, x in res.outputs.items()}
        run = ImplRun(outs, t, list(range(res.chunks.n_chunks)), list(range(inputs.shape[2])))
        run.tap_storage = {"ki": torch.bfloat16, "S": torch.bfloat16}
        return run


def test_rounding_bound_is_half_an_ulp_of_the_storage():
    from kdadbg.impls.base import rounding_bound
    x = torch.randn(4096, dtype=torch.float64) * torch.logspace(-20, 20, 4096, dtype=torch.float64)
    b = rounding_bound(x, torch.bfloat16)
    assert bool(((x.to(torch.bfloat16).double() - x).abs() <= (b - x).abs()).all())    # no rounding is worse
    rel = ((b - x) / x).abs()
    assert float(rel.min()) > 2.0 ** -9 * 0.99 and float(rel.max()) <= 2.0 ** -8


def test_a_16_bit_tap_has_its_rounding_as_a_floor_and_a_planted_fault_is_still_a_bug():
    # ki of a lower-bound dump whose one channel decays at the bound: each cell's norm sits on a few
    # elements, and one float32 run's own rounding of them can be far under a bf16 half-ulp
    inputs, config = case_inputs("kimi")
    g = inputs.g.clone()
    g[..., 0], g[..., 1:] = 20.0, -20.0
    inputs = dataclasses.replace(inputs, g=g)
    res = diff_dump(inputs, config, _TwiceRounded(), names=("ki", "S"), window=0)
    ki = res.cells["ki"]
    assert float(ki.floor.min()) >= 2.0 ** -9 * 0.99, "the floor of a bf16 tap is at least its rounding bound"
    assert res.first_bug is None and int((ki.label == DRIFT).sum()) > 0     # over tol, within the floor
    planted = diff_dump(inputs, config, _TwiceRounded(plant=3), names=("ki", "S"), window=0)
    assert (planted.first_bug["tap"], planted.first_bug["chunk"]) == ("S", 3)


def test_cpu_kernels_refuse_a_process_that_imported_triton_for_the_compiler():
    """A process that imported Triton without TRITON_INTERPRET cannot run our kernels under the interpreter
    (Triton's own @triton.jit functions were made for the compiler): one KdadbgError naming the fix, instead of
    an InterpreterError from inside a kernel."""
    import os
    import subprocess
    import sys

    code = ("import triton\n"
            "from kdadbg.errors import KdadbgError\n"
            "from kdadbg.impls.ours import kernels_module\n"
            "try:\n"
            "    kernels_module('cpu')\n"
            "except KdadbgError as e:\n"
            "    print('refused:', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                       cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("refused: --device cpu: Triton was imported in this process without "
                               "TRITON_INTERPRET") and "set TRITON_INTERPRET=1 before starting it" in p.stdout
    p = subprocess.run([sys.executable, "-c", code.replace("import triton\n", "")], capture_output=True, text=True,
                       env=env, timeout=300, cwd=REPO)
    assert p.returncode == 0 and p.stdout == "", (p.stdout, p.stderr[-2000:])


def test_a_function_with_its_own_precision_default_gets_a_note():
    """Our autograd op runs in bf16 mode unless told (its ``precision="bf16"``); kdadbg passes a user
    function no precision, so a run at another --precision says so instead of leaving a wall of FAIL
    unexplained. A function without such a parameter, or whose default is the run's mode, gets none."""
    from kdadbg.impls.function import own_precision_note

    def op(q, k, v, g, beta, precision="bf16"):
        raise AssertionError("not called")

    def plain(q, k, v, g, beta, **kw):
        raise AssertionError("not called")

    note = own_precision_note(op, "m:op", "fp32")
    assert note is not None and "precision='bf16'" in note and "--precision bf16" in note
    assert own_precision_note(op, "m:op", "bf16") is None
    assert own_precision_note(plain, "m:plain", "fp32") is None
    from kdadbg_kernels import chunk_kda
    assert own_precision_note(chunk_kda, "kdadbg_kernels:chunk_kda", "fp32") is not None


def test_precision_bf16_on_a_float32_dump_says_it_only_sets_the_tolerances():
    """``--impl X --precision bf16`` on a float32 dump: kdadbg computes nothing in bf16 for X, so the run
    says that the precision picked the tolerances only (it changed the verdict's table silently before); a
    bf16 dump, an fp32 run, or a function with its own precision parameter gets no such note."""
    inputs, config = case_inputs("basic")
    notes = check(inputs, config, impl=impl(precision="bf16")).notes
    assert any("float32 tensors as they are; --precision bf16 sets only the tolerances" in n for n in notes), notes
    assert not any("sets only the tolerances" in n for n in check(inputs, config, impl=impl()).notes)
    low = dataclasses.replace(inputs, **{n: getattr(inputs, n).to(torch.bfloat16) for n in ("q", "k", "v", "g",
                                                                                              "beta")})
    assert not any("sets only the tolerances" in n for n in check(low, config, impl=impl(precision="bf16")).notes)


def test_a_taps_file_written_at_the_other_precision_says_so(tmp_path):
    """A file from `run --precision bf16 --save` judged at the default fp32 was a wall of BUG with no word of
    why (user trial, round 39): its metadata's precision is named with the --precision to use, in diff
    --against and in diff A B; at its own precision, no note."""
    from kdadbg.diff import diff_taps_files
    from kdadbg.impls.tapsfile import TapsFile
    from kdadbg.tapsfile import read_taps_file

    inputs, config = case_inputs("basic")
    res = run_reference(inputs, config, taps=(), dtype=torch.float32)
    path = tmp_path / "bf16.safetensors"
    write_taps_file(path, dict(res.outputs), {}, chunk_rows(res.chunks, 0, res.chunks.n_chunks), [0, 1],
                    taps_metadata("ours", "d", config, precision="bf16"))
    notes = diff_dump(inputs, config, TapsFile(path, TapsSpec(), "fp32"), window=0).notes
    assert any("written at precision bf16 (its metadata)" in n and "use --precision bf16" in n for n in notes), notes
    notes = diff_dump(inputs, config, TapsFile(path, TapsSpec(), "bf16"), window=0).notes
    assert not any("written at precision" in n for n in notes), notes
    f = read_taps_file(path)
    assert any("written at precision bf16" in n for n in diff_taps_files(f, f, precision="fp32").notes)
    empty = tmp_path / "outputs_only.safetensors"    # an empty chunk table: one line, not min() of nothing
    write_taps_file(empty, dict(res.outputs), {}, chunk_rows(res.chunks, 0, 0), [], taps_metadata("x", "d", config))
    with pytest.raises(KdadbgError, match="holds no taps"):
        diff_taps_files(read_taps_file(empty), f)


def test_dt_bias_goes_flat_as_fla_takes_it(tmp_path):
    """fla's chunk_kda returns dt_bias's gradient as [H*K] whatever it was given, and autograd refused it for
    a [H, K] dt_bias (`--impl fla.ops.kda:chunk_kda` failed on every gated dump, user trial round 39): it is
    passed flat, as fla's layer holds it, and its gradient compared in the dump's shape."""
    from kdadbg.impls.function import no_gpu_hint

    path = tmp_path / "flat.py"
    path.write_text("import sys\nsys.path.insert(0, %r)\nfrom tests.impls.torch_kda import chunk_kda as _k\n"
                    "SEEN = []\n\n"
                    "def fn(q, k, v, g, beta, *, dt_bias=None, **kw):\n"
                    "    SEEN.append(tuple(dt_bias.shape))\n"
                    "    assert dt_bias.dim() == 1, 'fla takes dt_bias flat'\n"
                    "    return _k(q, k, v, g, beta, dt_bias=dt_bias, **kw)\n" % str(REPO))
    inputs, config = case_inputs("basic")
    assert inputs.dt_bias.dim() == 2
    res = check(inputs, config, impl=resolve_impl(f"{path}:fn"))
    assert res.passed and "ddt_bias" in [t.name for t in res.tensors if t.compared], res.tensors
    assert no_gpu_hint(RuntimeError("0 active drivers ([]). There should only be one."), "fla.ops.kda:chunk_kda") \
        .startswith("; Triton found no GPU: on the CPU fla's chunk_kda runs as --impl fla")
    assert no_gpu_hint(RuntimeError("shape mismatch"), "fla.ops.kda:chunk_kda") == ""


def test_an_fp32_backward_behind_a_bf16_o_is_judged_on_the_do_it_received():
    """User trial, round 40: a float32 implementation that returns o in bf16 (as production kernels store it)
    receives do in bf16 (autograd hands an output's gradient in its dtype); against a reference fed the dump's
    float32 do, its exact backward read as thousands of BUG cells ("dU chunk 21 ... introduced here"). The
    reference and the noise floor now take do as it was received, with a note: run, diff, and a seeded
    window pass."""
    inputs, config = case_inputs("basic")
    assert inputs.do.dtype == torch.float32
    fn = impl("bf16_out")
    res = check(inputs, config, impl=fn)
    assert res.verdict == "pass", [(t.name, t.ratio, t.tol) for t in res.tensors]
    assert any("received the upstream gradient rounded (do to bfloat16" in n for n in res.notes), res.notes
    assert {t.name for t in res.tensors} >= {"dq", "dk", "dv", "dg", "dbeta"}
    d = diff_dump(inputs, config, fn, window=0)
    n = d.counts()
    assert d.verdict == "pass" and n["bug"] == 0 and n["row_cells"] > 0, n
    assert any("received the upstream gradient rounded" in x for x in d.notes)
    w = check(inputs, config, impl=fn, chunks=(1, 3))
    assert w.verdict == "pass", [(t.name, t.ratio, t.tol) for t in w.tensors]
    ds = diff_dump(inputs, config, fn, chunks=(1, 3), seeded=True, window=0)
    assert ds.verdict == "pass" and ds.counts()["row_cells"] > 0
    # the same rounding where the dump's do is already bf16 changes nothing, and says nothing
    same = dataclasses.replace(inputs, do=inputs.do.to(torch.bfloat16).float())
    assert not any("received the upstream" in x for x in check(same, config, impl=fn).notes)


def test_the_python_api_takes_a_function_or_a_name_as_impl():
    """User trial, round 40: check(impl=<function>) and impl="path.py:fn" raised AttributeError ('function'
    object has no attribute 'config_for'). check and diff_dump take a function, a name or path as --impl
    takes it, or an Implementation; anything else is one line."""
    from tests.impls.torch_kda import chunk_kda

    inputs, config = case_inputs("basic")
    assert check(inputs, config, impl=chunk_kda).verdict == "pass"
    assert check(inputs, config, impl=f"{IMPL}:chunk_kda").impl["name"] == f"{IMPL}:chunk_kda"
    assert diff_dump(inputs, config, chunk_kda, window=0).verdict == "pass"
    assert diff_dump(inputs, config, "reference", window=0).verdict == "pass"
    with pytest.raises(KdadbgError, match="impl: expected an Implementation.*found int"):
        check(inputs, config, impl=3)


def test_a_taps_spec_takes_any_case_and_its_error_names_the_implementation(tmp_path):
    """User trial, round 40: TapsSpec("VK") was refused (the dump's keyword values take any case), and a bad
    TapsSpec built inside a function said nothing of which implementation."""
    assert TapsSpec("VK", "Log2") == TapsSpec("vk", "log2")
    impl_file = tmp_path / "bad_spec.py"
    impl_file.write_text("from kdadbg.impls import TapsSpec\n\ndef fn(q, k, v, g, beta, **kw):\n"
                         "    TapsSpec('kvv')\n")
    inputs, config = case_inputs("basic")
    with pytest.raises(KdadbgError, match=rf"^--impl {impl_file}:fn: taps state layout: expected kv or vk, found 'kvv'"):
        check(inputs, config, impl=f"{impl_file}:fn")


def _dv_fault(v):
    from tests.impls import torch_kda as tk

    f = torch.ones(1, v.shape[1], 1, 1, dtype=v.dtype)
    f[:, 16:32] += 1.5e-4           # dv of chunk 1's tokens 1.5e-4 off: 15x fp32's tolerance
    return tk._ScaleGrad.apply(v, f)


def _dv_fault_fn(ht_dtype):
    from tests.impls import torch_kda as tk

    def fn(q, k, v, g, beta, **kw):
        o, ht = tk.chunk_kda(q, k, _dv_fault(v), g, beta, **kw)
        return o, (None if ht is None else ht.to(ht_dtype))
    return fn


@pytest.mark.parametrize("ht_dtype", [torch.float32, torch.bfloat16])
def test_a_seeded_window_of_an_implementation_with_a_bf16_final_state_still_finds_a_gradient_bug(ht_dtype):
    """Review, round 40: in a seeded diff window the reference took the dht seeds rounded to a bf16 ht (as the
    implementation received them) and the noise floor did not: the floor took the rounding as noise (dv
    floors 2e-7 -> 1e-4) and a dv 1.5e-4 off read UNREP, verdict pass. Both take them as received now."""
    inputs, config = case_inputs("t64")
    res = diff_dump(inputs, config, _dv_fault_fn(ht_dtype), chunks=(0, 2), seeded=True, window=0)
    dv = [c for c in res.as_json()["cells"] if c["tap"] == "dv" and c["chunk"] == 1]
    assert res.verdict == "fail" and any(c["label"] == "BUG" for c in dv), [(c["ratio"], c["floor"]) for c in dv]
    assert res.as_json()["tensors"]["dv"]["failed"]


def test_the_windows_dht_seeds_received_rounded_are_said():
    """Review, round 40: on a dump without dht, a seeded window's dht seeds reached an implementation with a
    bf16 final state rounded (and the reference took them so) with nothing said."""
    inputs, config = case_inputs("h0_only")
    assert inputs.dht is None
    fn = _dv_fault_fn(torch.bfloat16)
    ct = chunk_table(*inputs.shape[:2], inputs.cu_seqlens, config.chunk_size)
    res = check(inputs, config, impl=fn, chunks=(0, max(1, ct.n_chunks - 1)))
    assert any("the windows' dht seeds to bfloat16" in n for n in res.notes), res.notes
    assert not any("dht seeds" in n for n in check(inputs, config, impl=fn).notes)


def test_a_do_that_a_float16_output_flushes_to_zero_judges_no_gradient():
    """Adversarial trial, round 40: a dump whose do (x 1e-9, as a captured mean loss's can be) is below fp16's
    smallest subnormal, and an implementation returning o in float16 with dk negated: its backward received an
    all-zero do, both sides' gradients were 0, and run passed (diff said partial). The gradients are not
    compared there (partial, the reason naming the rounding), and the note says how much the rounding took."""
    inputs, config = case_inputs("basic")
    tiny = dataclasses.replace(inputs, do=inputs.do * 1e-9, dht=None)

    def fp16_out_dk_negated(q, k, v, g, beta, **kw):
        from tests.impls import torch_kda as tk

        k = tk._ScaleGrad.apply(k, -torch.ones(1, k.shape[1], 1, 1))
        o, ht = tk.chunk_kda(q, k, v, g, beta, **kw)
        return o.to(torch.float16), ht

    res = check(tiny, config, impl=fp16_out_dk_negated)
    assert res.verdict == "partial" and "dk" in res.not_provided, res.verdict
    assert "rounded to its output's 16-bit dtype" in res.not_provided["dk"]
    assert diff_dump(tiny, config, fp16_out_dk_negated, window=0).verdict == "partial"
    milder = dataclasses.replace(inputs, do=inputs.do * 1e-6, dht=None)
    note = [n for n in check(milder, config, impl=fp16_out_dk_negated).notes if "received the upstream" in n]
    assert len(note) == 1 and "of its nonzero elements flushed to 0" in note[0], note
