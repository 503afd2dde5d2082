"""Seeded windows (``run --chunks``, ``diff --chunks``), the interpreter's time estimate and the
progress that ticks against it (issue: real-size dumps without a GPU)."""

import dataclasses
import json
import time

import pytest
import torch
from typer.testing import CliRunner

from kdadbg import cli
from kdadbg.cases import get_case, make_inputs, with_size
from kdadbg.chunks import chunk_table
from kdadbg.diff import diff_dump
from kdadbg.dump import save_dump
from kdadbg.impls import resolve_impl
from kdadbg.progress import ticking
from kdadbg.run import check
from conftest import REPO

IMPL = str(REPO / "tests" / "impls" / "torch_kda.py")
runner = CliRunner()


def fn(name="chunk_kda"):
    return resolve_impl(f"{IMPL}:{name}")


def marked(case, chunk, head):
    from tests.impls.torch_kda import plant_mark

    inputs, config = make_inputs(get_case(case))
    ct = chunk_table(*inputs.shape[:2], inputs.cu_seqlens, config.chunk_size)
    return dataclasses.replace(inputs, beta=plant_mark(inputs.beta, int(ct.start[chunk]), head)), config


def test_run_on_a_window_compares_its_tokens_and_the_states_it_ends_and_starts():
    inputs, config = make_inputs(get_case("varlen"))          # cu_seqlens [0,15,100,300]: chunks 0 | 1..6 | 7..19
    res = check(inputs, config, impl=fn(), chunks=(2, 9))       # seq 1 from its chunk 2, seq 2's first two chunks
    assert res.passed and res.window == [2, 9]
    rows = {t.name: t for t in res.tensors}
    tokens = (85 - 16) + 32                                     # seq 1 (85 tokens) from its token 16, seq 2: 32
    assert rows["o"].count == tokens * 3 * 16 and rows["dbeta"].count == tokens * 3
    assert rows["ht"].count == 3 * 16 * 16                      # seq 1's window ends it: its ht only
    assert rows["dh0"].count == 3 * 16 * 16                     # seq 2's window starts it: its dh0 only
    assert set(res.not_provided) == {"dA_log", "ddt_bias"} and "seeded" in res.notes[-1]
    ours = check(inputs, config, chunks=(7, 8))
    assert ours.passed and {t.name for t in ours.tensors} == {"o", "dq", "dk", "dv", "dg", "dbeta", "dh0"}


def test_seeded_diff_names_a_fault_in_the_window_and_not_one_before_it():
    inputs, config = marked("zero_gates", 1, 1)                 # T=70: chunks 0..4; fault in chunk 1
    res = diff_dump(inputs, config, fn("fwd_fault"), chunks=(1, 3), seeded=True)
    first = res.first_divergence
    assert (first["tap"], first["chunk"], first["head"], first["label"]) == ("o", 1, 1, "BUG")
    assert res.origin["verdict"] == "introduced"
    late = diff_dump(inputs, config, fn("state_fault"), chunks=(2, 5), seeded=True, window=0)
    assert late.passed            # the state carried wrongly out of chunk 1 is not in a window seeded from chunk 2
    full = diff_dump(inputs, config, fn("state_fault"), chunks=(2, 5), window=0)
    assert not full.passed and full.first_divergence["chunk"] == 2   # the whole run carries it in


def test_cli_run_and_diff_on_a_window(tmp_path):
    inputs, config = make_inputs(get_case("t200"))              # 13 chunks
    dump = save_dump(tmp_path / "d.safetensors", inputs, config)
    r = runner.invoke(cli.app, ["run", str(dump), "--chunks", "10:", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "ran on 1 window(s)" in r.stdout and "not provided" in r.stdout
    # adversarial trial, round 48: diff --chunks left dA_log/ddt_bias out with no word; the window's note names
    # what a window cannot compare
    r = runner.invoke(cli.app, ["diff", str(dump), "--chunks", "11:13", "--device", "cpu", "--impl", f"{IMPL}:chunk_kda"])
    assert r.exit_code == 0, r.output
    assert "chunks 11:13" in r.stdout and "verdict: pass" in r.stdout
    # adversarial trial, round 48: diff --chunks left dA_log/ddt_bias out with no word; the window's note names
    # what a window cannot compare, and why
    out = " ".join(r.stdout.split())
    assert "not compared in a window: dh0, dA_log, ddt_bias (a window's dA_log/ddt_bias cover its chunks only" in \
        out and "no window starts its sequence)" in out, out


def test_slow_interpreter_runs_are_refused_up_front_with_the_estimate(tmp_path):
    inputs, config = make_inputs(with_size(get_case("t200"), T=2000, H=2))
    dump = save_dump(tmp_path / "d.safetensors", inputs, config)
    for cmd in (["run"], ["diff"], ["taps", "-o", str(tmp_path / "t.safetensors"), "--source", "ours"]):
        r = runner.invoke(cli.app, [cmd[0], str(dump), *cmd[1:], "--device", "cpu", "--max-interpreter-s", "5"])
        assert r.exit_code == 2, r.output
        assert "estimated" in r.stderr and "125 chunks x 2 heads" in r.stderr and "--device cuda" in r.stderr
        assert r.stderr.count("\n") == 1
        if cmd[0] == "taps":   # its --chunks picks the taps exported, and its implementation is --source (round 46)
            assert "--source ours under the Triton interpreter" in r.stderr and "another --source" in r.stderr
            assert "a chunk window of run or diff (here --chunks picks the taps exported" in r.stderr
        else:
            assert "--chunks A:B" in r.stderr and "another --impl" in r.stderr
    assert not (tmp_path / "t.safetensors").exists()
    r = runner.invoke(cli.app, ["run", str(dump), "--device", "cpu", "--max-interpreter-s", "5", "--chunks", "0:1"])
    assert r.exit_code == 0, r.output                            # one chunk x 2 heads fits
    r = runner.invoke(cli.app, ["run", str(dump), "--device", "cpu", "--max-interpreter-s", "-5"])
    assert r.exit_code == 2 and "--max-interpreter-s: expected seconds, 0 or more, found -5" in r.stderr, r.output


def test_the_estimate_follows_the_measured_rate():
    from kdadbg.impls.ours import interpreter_estimate

    small, cfg = make_inputs(with_size(get_case("t16"), K=8, V=8))
    est, how = interpreter_estimate(small, cfg)
    assert 1.5 < est < 3 and "1 chunks x 1 heads" in how
    big, cfg = make_inputs(with_size(get_case("t16"), T=8192, H=16, K=128, V=128))
    est, _ = interpreter_estimate(big, dataclasses.replace(cfg, chunk_size=64))
    assert est > 600       # 128 chunks x 16 heads at K=V=128, chunk 64: out of reach without a GPU
    assert interpreter_estimate(big, dataclasses.replace(cfg, chunk_size=64), n_chunks=4)[0] < 70


def test_progress_ticks_against_the_estimate():
    seen = []
    with ticking(lambda s, d, t: seen.append((s, d, t)), "ours", 10.0, every_s=0.05, min_s=1.0):
        time.sleep(0.3)
    assert seen[0][1:] == (0, 10) and seen[-1][1:] == (10, 10) and "estimated" in seen[0][0]
    assert len(seen) >= 4 and all(d <= 9 for _, d, _ in seen[1:-1])
    seen.clear()
    with ticking(lambda s, d, t: seen.append((d, t)), "reference", None):
        pass
    with ticking(lambda s, d, t: seen.append((d, t)), "short", 3.0):   # under 10 s: no ticking
        pass
    assert seen == [(0, 1), (1, 1), (0, 1), (1, 1)]
    seen.clear()   # past the estimate the total moves with the seconds (it sat at 19/20: user trial, round 41)
    with ticking(lambda s, d, t: seen.append((d, t)), "fla", 1.0, every_s=0.05, min_s=0.5):
        time.sleep(2.3)
    assert (2, 3) in seen and all(d < t for d, t in seen[1:-1]) and seen[-1][0] == seen[-1][1] >= 3, seen


def worst(d: torch.Tensor) -> float:
    return float(d.abs().max()) if d.numel() else 0.0


WINDOWS = [pytest.param("varlen", (2, 9), id="varlen-two-sequences"),      # seq 1 from chunk 2, seq 2's first two
           pytest.param("basic", (1, 2), id="batched-middle"),              # B=2: chunks 0,1,2 | 3,4,5
           pytest.param("basic", (2, 4), id="batched-end-and-start"),
           pytest.param("chunk64", (1, 2), id="chunk64-tail"),
           pytest.param("gva_varlen", (1, 3), id="gva-varlen"),
           pytest.param("kv_layout", (0, 1), id="kv-first-chunk")]


@pytest.mark.parametrize("case, chunks", WINDOWS)
def test_seeds_are_the_full_references_states(case, chunks):
    from kdadbg.compare import ChunkInfo
    from kdadbg.reference import run_reference
    from kdadbg.window import plan, seeds

    inputs, config = make_inputs(get_case(case))
    full = run_reference(inputs, config, taps=("S", "dS"))
    info = ChunkInfo.from_table(full.chunks)
    st = seeds(inputs, config, info, *chunks)
    for w in plan(info, *chunks):
        wanted = [("S", w.first)] + ([("dS", w.last + 1)] if w.last < info.seq_chunks(w.seq)[-1] else [])
        for name, c in wanted:
            a, b = st[name][c], full.taps[name][c]
            assert torch.isfinite(a).all() and worst(a - b) <= 1e-12 * worst(b), (name, c)
    walked = torch.isfinite(st["S"]) | torch.isfinite(st["dS"])
    assert walked.any()
    for name in ("S", "dS"):           # wherever the states were walked, they are the reference's
        m = torch.isfinite(st[name])
        assert worst(st[name][m] - full.taps[name][m]) <= 1e-12 * max(1.0, worst(full.taps[name]))


@pytest.mark.parametrize("case, chunks", WINDOWS)
def test_the_windows_reference_is_the_full_reference_there(case, chunks):
    from kdadbg.compare import ChunkInfo
    from kdadbg.reference import run_reference
    from kdadbg.window import reference_run, seeded_run, seeds
    from kdadbg_kernels.taps import TAP_NAMES, TapSelection

    inputs, config = make_inputs(get_case(case))
    full = run_reference(inputs, config)
    ct = full.chunks
    info = ChunkInfo.from_table(ct)
    st = seeds(inputs, config, info, *chunks)
    win = reference_run(inputs, config, st, info, ct, *chunks, "cpu", taps=TapSelection(names=TAP_NAMES))
    _, masks = seeded_run(resolve_impl("reference"), inputs, config, full.taps, info, ct, *chunks, "cpu")
    lo, hi = chunks
    for name, t in win.taps.items():
        ref = full.taps[name][lo:hi]
        assert t.dtype == torch.float64 and t.shape == ref.shape, name
        assert worst(t - ref) <= 1e-12 * max(1.0, worst(ref)), name
    for name, t in win.outputs.items():
        ref = full.outputs[name]
        m = masks["tokens"].reshape(*ref.shape[:2]) if name not in ("ht", "dh0") else masks[name]
        got, want = t.reshape(ref.shape)[m], ref[m]
        assert t.dtype == torch.float64 and torch.isnan(t.reshape(ref.shape)[~m]).all(), name
        assert worst(got - want) <= 1e-12 * max(1.0, worst(want)), name


def test_a_windowed_run_compares_the_same_elements_against_the_same_values():
    """The window's reference and seeds replace the whole reference: the same elements compared,
    the same errors (to float64 rounding), the same worst elements."""
    from kdadbg import window
    from kdadbg.compare import ChunkInfo, compare
    from kdadbg.reference import run_reference
    from kdadbg.run import _window_mask
    from kdadbg.tapsfile import outputs_that_apply

    inputs, config = make_inputs(get_case("varlen"))
    res = check(inputs, config, impl=fn(), chunks=(2, 9))
    full = run_reference(inputs, config, taps=("S", "dS"))
    info = ChunkInfo.from_table(full.chunks)
    got, masks = window.seeded_run(fn(), inputs, config, full.taps, info, full.chunks, 2, 9, "cpu")
    B, T = inputs.shape[:2]
    before = {n: compare(n, got.outputs[n], full.outputs[n], _window_mask(n, masks, B, T, full.outputs[n].ndim))
              for n in outputs_that_apply(inputs, config) if n in got.outputs}
    assert {t.name for t in res.tensors} == set(before)
    for t in res.tensors:
        b = before[t.name]
        assert (t.count, t.shape, t.nonfinite) == (b.count, b.shape, b.nonfinite), t.name
        assert t.ratio == pytest.approx(b.ratio, rel=1e-6, abs=1e-12), t.name


@pytest.mark.parametrize("case, chunks", [pytest.param("varlen", (2, 9), id="varlen"),
                                          pytest.param("no_state", (0, 2), id="no-h0-no-dht")])
def test_a_seeded_diff_compares_the_same_cells_as_with_the_whole_reference(monkeypatch, case, chunks):
    """As before the window's reference: the whole reference's states, taps and outputs (and the whole
    float32 floor) give the same cells, and the same ratios to float64 rounding."""
    from kdadbg import window
    from kdadbg.impls.base import ImplRun
    from kdadbg.reference import run_reference

    inputs, config = make_inputs(get_case(case))
    new = diff_dump(inputs, config, fn(), chunks=chunks, seeded=True, window=0)

    def whole_states(inputs, config, info, lo, hi, device="cpu", progress=None):
        return {n: t.clone() for n, t in run_reference(inputs, config, taps=("S", "dS")).taps.items()}

    def whole_reference(inputs, config, seeded, info, ct, lo, hi, device, taps=None, dtype=torch.float64,
                        dot_dtype=None, name="reference", progress=None, upstream=None):
        res = run_reference(inputs, config, taps=taps.names, dtype=dtype, dot_dtype=dot_dtype)
        return ImplRun(res.outputs, {n: t[lo:hi] for n, t in res.taps.items()}, list(range(lo, hi)),
                       list(range(inputs.HV)))

    monkeypatch.setattr(window, "seeds", whole_states)
    monkeypatch.setattr(window, "reference_run", whole_reference)
    old = diff_dump(inputs, config, fn(), chunks=chunks, seeded=True, window=0)
    assert set(new.cells) == set(old.cells) and new.passed == old.passed
    for name, c in new.cells.items():
        o = old.cells[name]
        assert c.chunks == o.chunks and c.heads == o.heads, name
        assert torch.allclose(c.ratio, o.ratio, rtol=1e-6, atol=1e-12), name


def test_the_interpreter_skip_keeps_every_bit(monkeypatch):
    from triton.runtime import interpreter as interp

    from kdadbg.impls.ours import kernels_module, run_kernels
    from kdadbg_kernels.taps import TAP_NAMES, TapSelection

    kernels_module("cpu")
    inputs, config = make_inputs(get_case("chunk64_varlen"))
    sel = TapSelection(names=TAP_NAMES)
    fast, fast_taps, _ = run_kernels(inputs, config, taps=sel)
    monkeypatch.setattr(interp, "_patch_lang", interp._patch_lang.original)
    monkeypatch.setattr(interp.GridExecutor, "__call__", interp.GridExecutor.__call__.original)
    slow, slow_taps, _ = run_kernels(inputs, config, taps=sel)
    for a, b in ((fast, slow), (fast_taps, slow_taps)):
        assert set(a) == set(b)
        for n in a:
            assert torch.equal(a[n].view(torch.int32), b[n].view(torch.int32)) if a[n].dtype == torch.float32 \
                else torch.equal(a[n], b[n]), n


def test_an_implementation_that_raises_on_the_window_rerun_keeps_the_report(tmp_path):
    # the window rerun is a B = 1 dump: a function that indexes batch row 1 raises there only
    mine = tmp_path / "mine.py"
    mine.write_text(f"""import functools, importlib.util
_s = importlib.util.spec_from_file_location("torch_kda_w", {IMPL!r})
tk = importlib.util.module_from_spec(_s)
_s.loader.exec_module(tk)


@functools.wraps(tk.fwd_fault)
def fn(q, *a, **kw):
    q[1]   # IndexError when B == 1
    return tk.fwd_fault(q, *a, **kw)
""")
    inputs, config = marked("basic", 1, 1)                      # B=2: the whole run works, and diverges
    dump = save_dump(tmp_path / "d.safetensors", inputs, config)
    out = tmp_path / "d.json"
    r = runner.invoke(cli.app, ["diff", str(dump), "--impl", f"{mine}:fn", "--device", "cpu", "--json", str(out)])
    assert r.exit_code == 1, r.output
    assert "first divergence" in r.stdout and "verdict: fail" in r.stdout
    assert "origin: not available (the implementation raised on the window rerun: " in r.stdout
    assert "IndexError" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "fail" and doc["first_divergence"]["chunk"] == 1
    assert doc["origin"]["verdict"] is None and doc["origin"]["window"] == [0, 2]   # from chunk 0: no S compared
    assert doc["origin"]["reason"].startswith("not available (the implementation raised on the window rerun: ")
    assert "IndexError" in doc["origin"]["reason"]


POSITIONAL = ("import sys\nsys.path.insert(0, %r)\nfrom tests.impls.torch_kda import chunk_kda as _k\n\n"
              "def at_token(q, k, v, g, beta, **kw):\n"
              "    o, ht = _k(q, k, v, g, beta, **kw)\n"
              "    hit = (torch.arange(o.shape[1]) == %d)[None, :, None, None].to(o.dtype)\n"
              "    return o + (0.01 * o).detach() * hit, ht   # o of one absolute token 1 %% off\n"
              "import torch\n")


def _positional(tmp_path, token):
    path = tmp_path / "positional.py"
    path.write_text(POSITIONAL % (str(REPO), token))
    return resolve_impl(f"{path}:at_token")


def _text(res):
    from rich.console import Console
    from kdadbg.render import difftables

    console = Console(record=True, width=250)
    difftables.render_first(console, res)
    return console.export_text()


def test_a_fault_at_an_absolute_token_is_named_where_the_window_rerun_moves_it(tmp_path):
    """o wrong at token 36 (chunk 2, zero_gates C=16): no S compared, the rerun of chunks 1..3 (from the state
    update before chunk 2) starts afresh at token 16 and the fault lands on its token 36, the dump's 52 (chunk 3).
    The text said only "inherited ... carried in"; the JSON's first_in_window gave the window's own token and
    chunk_in_seq (user trial, round 39): now the dump's coordinates, and a line says the fault moved with the
    window's start."""
    inputs, config = make_inputs(get_case("zero_gates"))
    res = diff_dump(inputs, config, _positional(tmp_path, 36), names=())
    first = res.first_divergence
    assert (first["tap"], first["chunk"], first["token"]) == ("o", 2, 36) and res.origin["verdict"] == "inherited"
    assert res.origin["window"] == [1, 3], res.origin["window"]
    w = res.origin["first_in_window"]
    assert (w["tap"], w["chunk"], w["seq"], w["chunk_in_seq"], w["token"]) == ("o", 3, 0, 3, 52), w
    text = _text(res)
    assert "the window's rerun itself has its first BUG at o chunk 3" in text and "token 52" in text, text
    assert "tied to token positions, not carried in" in text, text
    assert "or is tied to where the chunk sits (its absolute token positions, its batch row or sequence)" in text
    # --window 0: no rerun, and the JSON says so instead of null (which reads as "nothing diverged")
    none = diff_dump(inputs, config, _positional(tmp_path, 36), names=(), window=0)
    assert none.origin == {"verdict": None, "reason": "not run (--window 0)"}
    assert "origin: not run (--window 0)" in _text(none)


def test_a_divergence_at_a_sequences_first_chunk_is_not_said_to_be_carried_in(tmp_path):
    """varlen (cu_seqlens [0,15,100,300], C=16): o wrong at packed token 20, in chunk 1, the first of sequence
    1. Nothing is carried into a sequence's first chunk from within it: the inherited verdict says the error
    comes from outside the sequence (or from token positions), not "carried in"."""
    inputs, config = make_inputs(get_case("varlen"))
    res = diff_dump(inputs, config, _positional(tmp_path, 20), names=())
    first = res.first_divergence
    assert (first["tap"], first["chunk"], first["seq"], first["chunk_in_seq"]) == ("o", 1, 1, 0)
    assert res.origin["verdict"] == "inherited" and res.origin["seq_start"] is True
    text = _text(res)
    assert "chunk 1 starts its sequence, so nothing is carried in from within it" in text, text
    assert "the error was carried in" not in text


def test_the_window_reruns_ratios_are_null_where_nothing_was_compared(tmp_path):
    """do all NaN: the window rerun's gradient rows are NaN on both sides, NOT_COMPARED in the diff, but its
    `origin.ratios` gave 0.0 for them (user trial, round 39): null, as the diff's own cells."""
    inputs, config = make_inputs(get_case("zero_gates"))
    inputs = dataclasses.replace(inputs, do=torch.full_like(inputs.do, float("nan")))
    res = diff_dump(inputs, config, _positional(tmp_path, 36), names=())
    assert res.origin["tap"] == "o" and res.origin["verdict"] == "inherited"
    ratios = res.origin["ratios"]
    assert all(r is None for r in ratios["dv"]) and all(r is None for r in ratios["dk"]), ratios
    assert all(r is not None for r in ratios["o"]), ratios
