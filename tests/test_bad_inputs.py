"""Issue 25: every bad input and every output path gives one clear line and exit 2, before any
computation, and nothing on disk is lost. One named row per case, as in ``test_dump.MALFORMED``.

Each row is ``(setup, fragments, keep)``: ``setup(tmp_path)`` writes the files it needs and returns
the command line; the command must exit 2 with one ``error:`` line on stderr containing every
fragment (so no progress line: nothing was computed); ``keep(tmp_path)`` returns ``{path: bytes or
None}`` that must hold afterwards (None: the path must not exist).
"""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import REPO
from kdadbg import fileio
from kdadbg.cases import get_case, make_inputs, with_size
from kdadbg.dump import KERNEL_MAX_HEAD_DIM, describe_dump, save_dump
from kdadbg.errors import KdadbgError
from kdadbg.outputs import OutputSet, check_output, check_outputs
from test_cli import assert_one_error_line, kdadbg

SMALL = with_size(get_case("t16"), K=8, V=8)  # one chunk, H=1, lower_bound gate, h0 and dht


def _dump(tmp_path, name="d.safetensors", case=SMALL, **meta):
    """A valid small dump (``meta`` overrides metadata strings; a value None drops the key)."""
    inputs, cfg = make_inputs(case)
    md = {**cfg.to_metadata(), **meta}
    path = tmp_path / name
    save_file({k: v.contiguous() for k, v in inputs.items()}, str(path),
              metadata={k: v for k, v in md.items() if v is not None})
    return path


def _taps(tmp_path, name):
    """A small taps file from the reference (no kernels)."""
    dump = tmp_path / "d.safetensors"
    if not dump.exists():
        _dump(tmp_path)
    out = tmp_path / name
    assert kdadbg("taps", dump, "-o", out, "--taps", "S,dS", "--device", "cpu").exit_code == 0
    return out


def _replace(tmp_path, name, **tensors):
    path = _dump(tmp_path)
    with safe_open(str(path), "pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    t.update(tensors)
    save_file(t, str(tmp_path / name), metadata=meta)
    return tmp_path / name


_IMMUTABLE: list = []


def _read_only(path):
    """Make ``path`` (file or folder) unwritable even for root: ``chattr +i`` as root, else chmod."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here")
    else:
        os.chmod(path, 0o555 if path.is_dir() else 0o444)
    _IMMUTABLE.append(path)
    return path


@pytest.fixture(autouse=True)
def _undo_read_only():
    yield
    while _IMMUTABLE:
        path = _IMMUTABLE.pop()
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], capture_output=True)
        else:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)


def _existing(tmp_path, name, content=b"keep me"):
    (tmp_path / name).write_bytes(content)
    return tmp_path / name


def _mkdir(tmp_path, name):
    (tmp_path / name).mkdir()
    return tmp_path / name


# --- setups: each returns the command line -------------------------------------------------------

def big_head_dim(command, **dims):
    def setup(tmp_path):
        path = tmp_path / "big.safetensors"
        save_dump(path, *make_inputs(with_size(SMALL, T=2, **dims)))
        extra = ["-o", tmp_path / "t.safetensors", "--source", "kernel"] if command == "taps" else []
        return [command, path, *extra]
    return setup


def inspect_k0(tmp_path):
    empty = torch.zeros(1, 16, 1, 0)
    return ["inspect", _replace(tmp_path, "k0.safetensors", q=empty, k=empty, g=empty)]


def head_first(*names):
    """``inspect`` on a dump whose ``names`` are head-first (dims 1 and 2 swapped: [B,H,T,*])."""
    def setup(tmp_path):
        path = _dump(tmp_path, "hf.safetensors", case=with_size(get_case("t16"), K=8, V=8, H=2))   # T=16, H=2
        with safe_open(str(path), "pt") as f:
            meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
        save_file({k: x.transpose(1, 2).contiguous() if k in names else x for k, x in t.items()}, str(path),
                  metadata=meta)
        return ["inspect", path]
    return setup


def plot_onto_existing(name):
    """``diff DUMP --plot NAME`` where a file NAME exists."""
    def setup(tmp_path):
        return ["diff", _dump(tmp_path), "--plot", _existing(tmp_path, name)]
    return setup


def force_onto_read_only(command, option):
    def setup(tmp_path):
        dump = _dump(tmp_path)
        target = _read_only(_existing(tmp_path, "ro.png" if option == "--plot" else "ro.out"))
        if command == "diff":
            return ["diff", _taps(tmp_path, "a.safetensors"), _taps(tmp_path, "b.safetensors"), option, target,
                    "--force"]
        return [command, dump, option, target, "--force"]
    return setup


def into_read_only_folder(command, option):
    def setup(tmp_path):
        dump = _dump(tmp_path)
        a = _taps(tmp_path, "a.safetensors") if command == "diff" else None
        folder = _read_only(_mkdir(tmp_path, "ro"))
        if command == "gen":
            return ["gen", folder / "x.safetensors"]
        if command == "diff":
            return ["diff", a, a, option, folder / "x.png"]
        return [command, dump, option, folder / "x.safetensors"]
    return setup


def dangling_link(command, option):
    def setup(tmp_path):
        dump = _dump(tmp_path)
        link = "link.png" if option == "--plot" else "link"   # (--plot's name is checked first: .png)
        os.symlink(tmp_path / "target", tmp_path / link)
        if command == "diff":
            a = _taps(tmp_path, "a.safetensors")
            return ["diff", a, a, option, tmp_path / link]
        if command == "gen":
            return ["gen", tmp_path / "link"]
        return [command, dump, option, tmp_path / "link"]
    return setup


def missing_folder(command, option, force=False):
    def setup(tmp_path):
        dump = _dump(tmp_path)
        out = tmp_path / "nodir" / ("x.png" if option == "--plot" else "x")
        if option == "-o":  # the output is a folder
            out = _mkdir(tmp_path, "adir")
        args = [command, _taps(tmp_path, "a.safetensors"), _taps(tmp_path, "b.safetensors")] \
            if command == "diff" else [command, dump]
        return [*args, option, out, *(["--force"] if force else [])]
    return setup


def diff_plot_then_bad_json(tmp_path):
    a = _taps(tmp_path, "a.safetensors")
    return ["diff", a, a, "--plot", tmp_path / "a.png", "--json", tmp_path / "nodir" / "d.json"]


def run_save_and_json_same(tmp_path):
    return ["run", _dump(tmp_path), "--save", tmp_path / "X", "--json", tmp_path / "X"]


def gen_too_big(tmp_path):
    return ["gen", tmp_path / "huge.safetensors", "--T", 100_000_000, "--H", 64, "--K", 128, "--V", 128]


def taps_into_folder(tmp_path):
    _dump(tmp_path)
    return ["taps", tmp_path / "d.safetensors", "-o", _mkdir(tmp_path, "adir")]


def taps_onto_own_input(tmp_path):
    dump = _dump(tmp_path)
    return ["taps", dump, "-o", dump, "--force"]


def bad_meta(**meta):
    def setup(tmp_path):
        return ["inspect", _dump(tmp_path, **meta)]
    return setup


def bad_override(*options):
    def setup(tmp_path):
        return ["taps", _dump(tmp_path), "-o", tmp_path / "t.safetensors", *options]
    return setup


def usage(*options, dump=True):
    """``options``, with the small dump after the command name when ``dump``."""
    def setup(tmp_path):
        return [options[0], *([_dump(tmp_path)] if dump else []), *options[1:]]
    return setup


def to_stdout(command, *options):
    """An output named ``-`` (stdout); the test runs in tmp_path, so a file ``-`` would show in its listing."""
    def setup(tmp_path):
        dump = _dump(tmp_path)
        if command == "gen":
            return ["gen", "-"]
        if command == "capture":
            return ["capture", "--out", "-", "--", sys.executable, "-c", "pass"]
        if command == "taps":
            return ["taps", dump, *options, "--taps", "none"]
        return [command, dump, *options, "--taps", "none"] if command == "diff" else [command, dump, *options]
    return setup


def inapplicable(command, *options, files=("dump",), case=SMALL):
    """``command`` on ``files`` ("dump": a small dump of ``case``; "taps": a taps file made from it) with an
    option that would be ignored; a ``"TAPS"`` among ``options`` is the taps file too."""
    def setup(tmp_path):
        dump = _dump(tmp_path, case=case)
        taps = _taps(tmp_path, "a.taps.safetensors") if "taps" in files or "TAPS" in options else None
        paths = [dump if f == "dump" else taps for f in files]
        return [command, *paths, *(taps if o == "TAPS" else o for o in options)]
    return setup


def truncated(tmp_path):
    dump = _dump(tmp_path)
    (tmp_path / "cut.safetensors").write_bytes(dump.read_bytes()[:-64])
    return ["inspect", tmp_path / "cut.safetensors"]


def _untouched(*names):
    """``keep``: the files ``names`` (in tmp_path) keep the bytes they had before the command."""
    return names


def _absent(*names):
    """``keep``: the paths ``names`` (in tmp_path) must not exist afterwards."""
    return tuple((n, None) for n in names)


def _bad(id_, setup, *fragments, keep=()):
    return pytest.param(setup, fragments, keep, id=id_)


BAD = [
    _bad("r2-K-over-limit-run", big_head_dim("run", K=300), "tensor 'q'", "K=300", f"up to {KERNEL_MAX_HEAD_DIM}"),
    _bad("r2-V-over-limit-run", big_head_dim("run", V=520), "tensor 'v'", "V=520", "up to 256"),
    _bad("r2-K-over-limit-diff", big_head_dim("diff", K=300), "K=300", "--source reference"),
    _bad("r2-K-over-limit-taps-kernel", big_head_dim("taps", K=300), "K=300", keep=_absent("t.safetensors")),
    _bad("r3-inspect-K0", inspect_k0, "tensor 'q'", "4 non-empty dims", "found [1,16,1,0]"),
    _bad("inspect-head-first-q", head_first("q", "k", "v", "g", "do"), "tensor 'beta'", "found [1,16,2]",
         "q looks head-first: [B,H,T,K] = [1,2,16,8] instead of [B,T,H,K] (read as T=2 tokens, H=16 heads), which "
         "would explain beta's shape", "transpose q, k, v, g and do (dims 1 and 2)"),
    _bad("inspect-head-first-beta", head_first("beta"), "tensor 'beta'", "expected shape [B,T,H] = [1,16,2]",
         "found [1,2,16]; beta looks head-first ([B,H,T], T and H swapped): transpose its dims 1 and 2"),
    _bad("diff-tol-near-miss", usage("diff", "--tol", "dgg=1e-3"), "--tol: expected NAME=VALUE with NAME a tap, a "
         "stage (fwd_prepare, fwd_recurrence, bwd_recurrence, bwd_prepare) or an output or gradient (o, ht, dq, dk, "
         "dv, dg, dbeta, dh0, dA_log, ddt_bias), found 'dgg=1e-3' (did you mean dg?)"),
    _bad("run-tol-near-miss", usage("run", "--tol", "DG=1e-3"), "found 'DG=1e-3' (did you mean dg?)"),
    _bad("inspect-head-first-v", head_first("v"), "tensor 'v'", "found [1,2,16,8]; v looks head-first"),
    _bad("r4-taps-force-read-only", force_onto_read_only("taps", "-o"), "--out", "read-only", "even with --force",
         keep=_untouched("ro.out")),
    _bad("r4-run-json-force-read-only", force_onto_read_only("run", "--json"), "--json", "read-only",
         keep=_untouched("ro.out")),
    _bad("r4-diff-plot-force-read-only", force_onto_read_only("diff", "--plot"), "--plot", "read-only",
         keep=_untouched("ro.png")),
    _bad("r5-taps-read-only-folder", into_read_only_folder("taps", "-o"), "--out", "folder", "not writable"),
    _bad("r5-gen-read-only-folder", into_read_only_folder("gen", None), "OUT", "not writable"),
    _bad("r5-diff-plot-read-only-folder", into_read_only_folder("diff", "--plot"), "--plot", "not writable"),
    _bad("r6-diff-plot-dangling-link", dangling_link("diff", "--plot"), "--plot", "already exists", "a link to",
         keep=_absent("target")),
    _bad("r6-gen-dangling-link", dangling_link("gen", None), "already exists", keep=_absent("target")),
    _bad("r6-run-json-dangling-link", dangling_link("run", "--json"), "already exists", keep=_absent("target")),
    _bad("r8-run-json-no-folder", missing_folder("run", "--json"), "--json", "folder", "does not exist"),
    _bad("r8-run-save-no-folder", missing_folder("run", "--save"), "--save", "does not exist"),
    _bad("r8-diff-plot-no-folder", missing_folder("diff", "--plot"), "--plot", "does not exist"),
    _bad("r8-taps-folder-force", missing_folder("taps", "-o", force=True), "--out", "is a folder"),
    _bad("r8-diff-plot-ok-json-no-folder", diff_plot_then_bad_json, "--json", "does not exist",
         keep=_absent("a.png")),
    _bad("r8-run-save-json-same-file", run_save_and_json_same, "--save", "also the --json output",
         keep=_absent("X")),
    _bad("r10-gen-too-big", gen_too_big, "GiB of memory", "available", "--T", keep=_absent("huge.safetensors")),
    _bad("r12-taps-into-folder", taps_into_folder, "--out", "is a folder"),
    _bad("r14-taps-onto-own-input", taps_onto_own_input, "--out", "is an input of this command",
         keep=_untouched("d.safetensors")),
    _bad("r15-lower-bound-positive", bad_meta(lower_bound="5"), "config lower_bound", "< 0", "'5'"),
    _bad("r15-lower-bound-zero", bad_meta(lower_bound="0"), "config lower_bound", "< 0"),
    _bad("r15-scale-zero", bad_meta(scale="0"), "config scale", "> 0", "'0'"),
    _bad("r15-scale-negative", bad_meta(scale="-0.25"), "config scale", "> 0", "'-0.25'"),
    _bad("r15-scale-inf", bad_meta(scale="inf"), "config scale", "finite"),
    _bad("r15-override-scale-negative", bad_override("--scale", "-0.25"), "override scale", "--scale", "> 0"),
    _bad("r15-override-lower-bound-positive", bad_override("--lower-bound", "2"), "--lower-bound", "< 0"),
    _bad("r15-taps-names-nothing", bad_override("--taps", ","), "--taps", "names nothing", "','"),
    _bad("r15-taps-empty", bad_override("--taps", ""), "--taps", "names nothing"),
    _bad("r16-chunks-past-end", bad_override("--chunks", "100:"), "--chunks '100:' selects no chunk",
         "1 chunks"),
    _bad("r16-truncated", truncated, "truncated", "the file holds"),
    # usage errors: one line, not click's usage box
    _bad("u1-run-no-dump", usage("run", dump=False), "run: missing argument DUMP (kdadbg run --help)"),
    _bad("u1-diff-no-file", usage("diff", dump=False), "diff: missing argument FILES"),
    _bad("u1-gen-no-out", usage("gen", dump=False), "gen: missing argument OUT", "--list", "(kdadbg gen --help)"),
    _bad("u1-taps-no-out", usage("taps"), "taps: missing the taps file to write", "-o FILE"),
    _bad("u1-run-precision-fp16", usage("run", "--precision", "fp16"),
         "run --precision: expected fp32 or bf16, found 'fp16'"),
    _bad("u1-run-gate-choice", usage("run", "--gate=sigmoid"),
         "run --gate: expected one of none, lower_bound, softplus, found 'sigmoid'"),
    _bad("u1-diff-window-not-int", usage("diff", "--window", "x"), "diff --window: expected an integer, found 'x'"),
    _bad("u1-run-unknown-option", usage("run", "--bogus"), "run: no such option --bogus (kdadbg run --help)"),
    _bad("u1-run-option-without-value", usage("run", "--json"), "run --json: expected a value after it, found none"),
    _bad("u1-run-extra-argument", usage("run", "extra"), "run: got unexpected extra argument", "extra"),
    _bad("u1-unknown-command", usage("bogus", dump=False), "no such command 'bogus' (kdadbg --help)"),
    # an output named - (stdout): refused, no file '-' written
    _bad("o2-run-json-stdout", to_stdout("run", "--json", "-"), "--json -: expected a file name", "stdout",
         keep=_absent("-")),
    _bad("o2-run-plot-stdout", to_stdout("run", "--plot", "-"), "--plot -: expected a file name", keep=_absent("-")),
    _bad("o2-run-save-stdout", to_stdout("run", "--save", "-"), "--save -: expected a file name", keep=_absent("-")),
    _bad("o2-diff-json-stdout", to_stdout("diff", "--json", "-"), "--json -: expected a file name",
         keep=_absent("-")),
    _bad("o2-diff-plot-stdout", to_stdout("diff", "--plot", "-"), "--plot -: expected a file name",
         keep=_absent("-")),
    _bad("o2-taps-o-stdout", to_stdout("taps", "-o", "-"), "--out -: expected a file name", keep=_absent("-")),
    _bad("o2-taps-out-argument-stdout", to_stdout("taps", "-"), "OUT -: expected a file name", keep=_absent("-")),
    _bad("o2-gen-stdout", to_stdout("gen"), "OUT -: expected a file name", keep=_absent("-")),
    _bad("o2-capture-out-stdout", to_stdout("capture"), "--out -: expected a folder", keep=_absent("-")),
    # an output option followed by another option (user trial, round 45: `run --json --force` wrote a file named
    # --force, and --force was not applied): refused, nothing written
    _bad("o2-run-json-then-force", usage("run", "--json", "--force"), "--json --force: expected a file name after "
         "--json", "'--force', an option's spelling", "was not applied", keep=_absent("--force")),
    _bad("o2-diff-plot-then-force", usage("diff", "--plot", "--force"), "--plot --force: expected a file name",
         keep=_absent("--force")),
    _bad("o2-run-save-then-json", usage("run", "--save", "--json", "r.json"), "run: --save: expected a file name "
         "after it, found the option --json", keep=_absent("--json", "r.json")),
    _bad("o2-run-json-then-precision", usage("run", "--json", "--precision", "bf16"), "run: --json: expected a file "
         "name after it, found the option --precision", "bf16 was left over", "run and diff take --json FILE",
         keep=_absent("--precision")),
    _bad("o1-diff-plot-json-exists", plot_onto_existing("d.json"), "d.json: expected a file name ending "
         "in .png", "found the suffix '.json'", keep=_untouched("d.json")),   # the name's fault first, not "exists"
    # options that would be ignored: refused, naming the option and why it does not apply
    _bad("i3-full-run-without-chunks", inapplicable("diff", "--full-run"), "--full-run", "with --chunks only"),
    _bad("i3-taps-state-layout-without-taps-file", inapplicable("diff", "--taps-state-layout", "vk"),
         "--taps-state-layout", "no taps file"),
    _bad("i3-taps-gate-units-without-taps-file", inapplicable("diff", "--taps-gate-units", "log2"),
         "--taps-gate-units", "no taps file"),
    _bad("i3-taps-state-layout-impl-ours", inapplicable("diff", "--impl", "reference", "--taps-state-layout", "kv"),
         "--taps-state-layout", "no taps file"),
    _bad("i3-repeat-two-taps-files", inapplicable("diff", "--repeat", "3", files=("taps", "taps")),
         "--repeat", "a taps file cannot be rerun"),
    _bad("i3-window-against-taps-file", inapplicable("diff", "--against", "TAPS", "--window", "5"),
         "--window", "a taps file cannot be rerun"),
    _bad("i3-window-impl-taps-file", inapplicable("diff", "--impl", "TAPS", "--window", "2"),
         "--window", "a taps file cannot be rerun"),
    _bad("i3-window-two-taps-files", inapplicable("diff", "--window", "2", files=("taps", "taps")),
         "--window", "a taps file cannot be rerun"),
    _bad("i3-run-lower-bound-with-softplus", inapplicable("run", "--gate", "softplus", "--lower-bound", "-3"),
         "--lower-bound", "lower_bound gate only", "the gate is softplus (from --gate)"),
    _bad("i3-diff-lower-bound-with-gate-none", inapplicable("diff", "--gate", "none", "--lower-bound", "-3"),
         "--lower-bound", "the gate is none (from --gate)"),
    _bad("i3-taps-lower-bound-with-softplus-dump",
         inapplicable("taps", "-o", "t.safetensors", "--lower-bound", "-3", case=with_size(get_case("gate_softplus"),
                                                                                            T=16, K=8, V=8)),
         "--lower-bound", "the gate is softplus", "metadata", keep=_absent("t.safetensors")),
    _bad("i3-taps-precision-with-reference", inapplicable("taps", "-o", "t.safetensors", "--source", "reference",
                                                          "--precision", "bf16"),
         "--precision", "--source reference", "float64", keep=_absent("t.safetensors")),
    _bad("i3-taps-precision-default-source", inapplicable("taps", "-o", "t.safetensors", "--precision", "fp32"),
         "--precision", "--source reference", keep=_absent("t.safetensors")),
    # a selection that names nothing, as ',' does
    _bad("s4-heads-empty", bad_override("--heads", ""), "--heads", "found ''", "names no head"),
    _bad("s4-heads-comma", bad_override("--heads", ","), "--heads", "found ','", "names no head"),
    _bad("s4-chunks-empty", bad_override("--chunks", ""), "--chunks", "found ''", "selects nothing"),
    _bad("s4-run-chunks-empty", usage("run", "--chunks", ""), "--chunks", "found ''"),
    _bad("s4-diff-heads-empty", usage("diff", "--heads", " "), "--heads", "names no head"),
    # an output named as another format's file: refused before any work, nothing written
    _bad("o1-gen-txt", usage("gen", "x.txt", dump=False), "OUT x.txt", "name it *.safetensors", ".txt is a text",
         "text", keep=_absent("x.txt")),
    _bad("o1-run-json-png", usage("run", "--json", "r.png"), "--json r.png", "name it *.json", "PNG",
         keep=_absent("r.png")),
    _bad("o1-run-save-npz", usage("run", "--save", "s.npz"), "--save s.npz", "name it *.safetensors", "NumPy",
         keep=_absent("s.npz")),
    _bad("o1-taps-out-json", usage("taps", "-o", "t.JSON"), "--out t.JSON", "name it *.safetensors", ".JSON is a JSON",
         keep=_absent("t.JSON")),
    # --json FILE as run and diff take it, given to inspect or taps, whose --json is a flag
    _bad("o2-taps-json-file", usage("taps", "-o", "t.safetensors", "--json", "t.json"), "t.json was taken as the taps "
         "file OUT", "-o t.safetensors names too", "--json is a flag", "run and diff take --json FILE",
         keep=_absent("t.json", "t.safetensors")),
    _bad("o2-taps-json-file-no-o", usage("taps", "--json", "t.json"), "t.json was taken as the taps file OUT",
         "--json is a flag", keep=_absent("t.json")),
    _bad("o2-inspect-json-file", usage("inspect", "--json", "i.json"), "inspect: unexpected argument i.json after "
         "--json", "--json is a flag", keep=_absent("i.json")),
    _bad("o1-diff-json-safetensors", usage("diff", "--json", "d2.safetensors"), "--json d2.safetensors",
         "name it *.json", "safetensors", keep=_absent("d2.safetensors")),
]


@pytest.mark.parametrize("setup, fragments, keep", BAD)
def test_bad_input_is_one_line_before_any_work(tmp_path, monkeypatch, setup, fragments, keep):
    monkeypatch.chdir(tmp_path)   # a relative output (-, say) would land here, in the listing compared below
    args = setup(tmp_path)
    before = {}
    for k in keep:
        if isinstance(k, str):
            before[k] = (tmp_path / k).read_bytes()
        else:
            before[k[0]] = k[1]
    listing = sorted(p.name for p in tmp_path.iterdir())
    r = kdadbg(*args)
    assert_one_error_line(r, *fragments)
    for name, content in before.items():
        path = tmp_path / name
        if content is None:
            assert not os.path.lexists(path), name
        else:
            assert path.read_bytes() == content, name
    assert sorted(p.name for p in tmp_path.iterdir()) == listing  # no temporary file left behind


# --- valid inputs that must work ----------------------------------------------------------------

def test_r1_float64_dump_runs_cast_to_float32(tmp_path):
    dump = tmp_path / "d64.safetensors"
    assert kdadbg("gen", dump, "--preset", "t16", "--K", 8, "--V", 8, "--dtype", "float64").exit_code == 0
    assert kdadbg("inspect", dump).exit_code == 0
    r = kdadbg("run", dump, "--device", "cpu")
    assert r.exit_code == 0, r.output
    said = r.stdout + r.stderr
    assert said.count("float64 inputs") == 1 and "cast to float32" in said, r.output   # said once, not twice
    r = kdadbg("taps", dump, "-o", tmp_path / "t.safetensors", "--source", "kernel", "--taps", "S", "--device", "cpu")
    assert r.exit_code == 0, r.output
    r = kdadbg("diff", dump, "--device", "cpu", "--taps", "fwd_recurrence", "--window", 0)
    assert r.exit_code == 0, r.output
    assert (r.stdout + r.stderr).count("float64 inputs") == 1, r.output


def test_r10_gen_refuses_a_file_the_disk_cannot_hold(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 20, 1 << 20, 1000))
    assert_one_error_line(kdadbg("gen", tmp_path / "d.safetensors"), "makes a file of about", "GiB free in")
    assert list(tmp_path.iterdir()) == []


def test_r2_kernel_limit_matches_the_kernels():
    from kdadbg_kernels.chunk import MAX_HEAD_DIM

    assert KERNEL_MAX_HEAD_DIM == MAX_HEAD_DIM
    assert f"up to {MAX_HEAD_DIM}" in (REPO / "README.md").read_text()


def test_r2_reference_takes_big_head_dims(tmp_path):
    path = tmp_path / "big.safetensors"
    save_dump(path, *make_inputs(with_size(SMALL, K=300, T=2)))
    r = kdadbg("taps", path, "-o", tmp_path / "t.safetensors", "--taps", "none")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("command, option", [
    pytest.param("taps", "-o", id="r6-taps"),
    pytest.param("gen", None, id="r6-gen"),
    pytest.param("diff", "--plot", id="r6-diff-plot"),
    pytest.param("diff", "--json", id="r6-diff-json"),
])
def test_r6_force_replaces_a_link_never_its_target(tmp_path, command, option):
    dump = _dump(tmp_path)
    target = _existing(tmp_path, "target", b"the link's target")
    link = tmp_path / ("link.png" if option == "--plot" else "link")   # --plot takes .png names only
    os.symlink(target, link)
    if command == "gen":
        args = ["gen", link, "--preset", "t16", "--force"]
    elif command == "diff":
        a = _taps(tmp_path, "a.safetensors")
        args = ["diff", a, a, option, link, "--force"]
    else:
        args = ["taps", dump, option, link, "--taps", "none", "--force"]
    r = kdadbg(*args)
    assert r.exit_code == 0, r.output
    assert not link.is_symlink() and link.stat().st_size > 0
    assert target.read_bytes() == b"the link's target"


def test_r8_failure_while_moving_outputs_writes_none(tmp_path, monkeypatch):
    """All or nothing: when the second output cannot be moved into place, the first is undone."""
    old = _existing(tmp_path, "a.json", b"old a")
    with OutputSet({"--json": old, "--save": tmp_path / "b.bin"}, force=True) as outs:
        outs.stage("--json").write_text("new a")
        outs.stage("--save").write_text("new b")
        real = os.rename
        calls = []

        def rename(src, dst):
            calls.append(dst)
            if str(dst).endswith("b.bin"):
                raise PermissionError(13, "Permission denied", str(dst))
            real(src, dst)
        monkeypatch.setattr(os, "rename", rename)
        with pytest.raises(Exception, match="no output of this command was written"):
            outs.commit()
        monkeypatch.setattr(os, "rename", real)
    assert old.read_bytes() == b"old a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_name_starting_with_a_dash_is_refused_as_an_options_value_only(tmp_path, monkeypatch):
    """An option's value spelled as an option (`--json --force`) is refused; a file capture writes under a folder
    whose name starts with '-' (label "") is not an option's value and is written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-d").mkdir()
    with pytest.raises(KdadbgError, match="expected a file name after --json"):
        check_output("--json", "--force")
    assert check_output("", "-d/s0000-c000.safetensors") == Path("-d/s0000-c000.safetensors")


def test_r8_output_checks_refuse_duplicates_and_inputs(tmp_path):
    dump = _dump(tmp_path)
    with pytest.raises(Exception, match="also the --json output"):
        check_outputs({"--json": tmp_path / "x", "--out": tmp_path / "." / "x"})
    (tmp_path / "sub").mkdir()
    with pytest.raises(Exception, match="is an input"):
        check_outputs({"--out": tmp_path / "sub" / ".." / "d.safetensors"}, inputs=[dump], force=True)


def test_r9_inspect_reads_no_extra_tensor(tmp_path, monkeypatch):
    path = _replace(tmp_path, "extra.safetensors", junk=torch.zeros(1 << 20))
    read = []
    real = fileio.read_tensors

    def spy(p, names=None):
        read.extend(names or ["<all>"])
        return real(p, names)
    monkeypatch.setattr("kdadbg.dump.read_tensors", spy)
    d = describe_dump(path)
    assert d["ok"] and d["extra"] == ["junk"]
    assert "junk" not in read and "<all>" not in read
    assert max(read.count(n) for n in read) == 1  # one tensor at a time, each read once
    junk = {r["name"]: r for r in d["tensors"]}["junk"]
    assert junk["shape"] == [1 << 20] and junk["dtype"] == "float32" and junk["min"] is None


def test_r11_complex_q_error_is_the_first_line(tmp_path):
    path = _replace(tmp_path, "cq.safetensors", q=make_inputs(SMALL)[0].q.to(torch.complex64))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = describe_dump(path)
    assert not d["ok"] and "complex64" in d["verdict"]
    assert not [w for w in caught if "complex" in str(w.message)]
    r = subprocess.run([sys.executable, "-W", "always", "-m", "kdadbg", "inspect", str(path)], capture_output=True,
                       text=True, cwd=REPO)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "complex64" in lines[0], r.stderr


def test_cli_drops_warnings_before_an_error(monkeypatch):
    def noisy(path):
        warnings.warn("an internal warning", UserWarning)
        return {"path": str(path), "ok": False, "verdict": "x: bad", "metadata": {}, "config": None,
                "sizes": None, "tensors": [], "extra": []}
    monkeypatch.setattr("kdadbg.dump.describe_dump", noisy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = kdadbg("inspect", "whatever.safetensors")
    assert_one_error_line(r, "x: bad")
    assert not caught


@pytest.mark.parametrize("meta, key, value", [
    pytest.param({"gate": "Lower_Bound"}, "gate", "lower_bound", id="r15-gate-any-case"),
    pytest.param({"state_layout": "VK"}, "state_layout", "vk", id="r15-layout-any-case"),
    pytest.param({"qk_l2norm": "FALSE"}, "qk_l2norm", False, id="r15-bool-any-case"),
    pytest.param({"gate": " softplus "}, "gate", "softplus", id="r15-gate-spaces"),
])
def test_r15_keyword_values_ignore_case(tmp_path, meta, key, value):
    d = describe_dump(_dump(tmp_path, **meta))
    assert d["ok"], d["verdict"]
    assert {r["key"]: r["value"] for r in d["config"]}[key] == value


@pytest.mark.parametrize("command", ["gen", "inspect", "taps", "run", "diff"])
def test_help_shows_flags_as_flags(command):
    r = subprocess.run([sys.executable, "-m", "kdadbg", command, "--help"], capture_output=True, text=True,
                       cwd=REPO, env={**os.environ, "COLUMNS": "100"})
    assert r.returncode == 0
    for bad in ("<bool>", "<list[", "<str>", "<int>", "<float>", "<path>", "{", "}"):
        assert bad not in r.stdout, (bad, r.stdout)
    rows = {line.split()[1]: line for line in r.stdout.splitlines() if line.startswith("│ --")}
    for flag in ("--help", "--force", "--json", "--list", "--strict"):
        if flag in rows and (flag != "--json" or command in ("inspect", "taps")):
            assert rows[flag].split()[2][0].isupper(), rows[flag]  # straight to the help text


# --- rows 7 and 13: nothing compared is never a pass; non-finite data is said and judged -------------


def test_r7_against_a_dump_or_an_unrelated_file_is_exit_2(tmp_path):
    dump = _dump(tmp_path)
    other = tmp_path / "other.safetensors"
    save_file({"unrelated": torch.zeros(3)}, str(other))
    r = kdadbg("diff", dump, "--against", dump)
    assert_one_error_line(r, "is a dump", "not a taps file")
    r = kdadbg("diff", dump, "--against", other)
    assert_one_error_line(r, "nothing to compare", "other.safetensors", "unrelated")


def _nan_dump(tmp_path):
    import dataclasses

    inputs, cfg = make_inputs(with_size(get_case("basic"), K=8, V=8))   # B 2, T 40, H 2, chunk 16
    q = inputs.q.clone()
    q[0, 3, 0, 2] = float("nan")
    return save_dump(tmp_path / "nan.safetensors", dataclasses.replace(inputs, q=q), cfg)


@pytest.mark.parametrize("command", ["run", "diff"])
def test_r13_nonfinite_inputs_are_said_and_what_they_reach_left_out(tmp_path, command):
    """A NaN in q (batch row 0, token 3, head 0). Requiring both sides to put NaN in the same elements would
    fail an implementation chunked otherwise (or a token recurrence) for where its NaN spread, which its
    chunking decides, not its correctness. What the NaN can reach (batch row 0's head 0, the whole
    forward from its 64-token block and backward) is left out on both sides; the rest is compared: ours,
    another chunking and one that zeroes its NaN all pass there, and say what was left out. (Inside the
    reach nothing is judged, not even a NaN replaced by 0: the cost of the bound, README.)"""
    dump = _nan_dump(tmp_path)
    impl = tmp_path / "impl.py"
    impl.write_text("import sys\nsys.path.insert(0, %r)\nfrom tests.impls.torch_kda import chunk_kda as _k\n\n"
                    "def chunked_otherwise(*a, **k):\n    k['chunk_size'] = 8\n    return _k(*a, **k)\n\n"
                    "def hides_nans(*a, **k):\n    o, ht = _k(*a, **k)\n    return o.nan_to_num(), ht\n"
                    % str(REPO))
    for fn in (None, "chunked_otherwise", "hides_nans"):
        extra = ["--impl", f"{impl}:{fn}"] if fn else []
        r = kdadbg(command, dump, "--allow-nonfinite", *extra, "--device", "cpu")
        out = " ".join(r.stdout.split())
        assert r.exit_code == 0, (fn, r.output)
        assert "compares non-finite data" in out and "same output elements" in out, out
        assert "left out as NaN/Inf inputs can reach them" in out and "o: 320" in out, out   # 40 tokens x V 8 of head 0


def test_r13_an_output_nan_where_the_reference_is_finite_is_a_bug(tmp_path):
    dump = _dump(tmp_path)
    impl = tmp_path / "impl.py"
    impl.write_text("import sys\nsys.path.insert(0, %r)\nfrom tests.impls.torch_kda import chunk_kda as _k\n\n"
                    "def one_nan(*a, **k):\n    o, ht = _k(*a, **k)\n    o = o.clone()\n"
                    "    o[0, 5, 0, 1] = float('nan')\n    return o, ht\n" % str(REPO))
    r = kdadbg("diff", dump, "--impl", f"{impl}:one_nan", "--json", tmp_path / "d.json", "--device", "cpu")
    assert r.exit_code == 1, r.output
    import json
    first = json.loads((tmp_path / "d.json").read_text())["first_divergence"]
    assert (first["tap"], first["label"], first["nonfinite"]) == ("o", "BUG", 1)
    r = kdadbg("run", dump, "--impl", f"{impl}:one_nan", "--device", "cpu")
    assert r.exit_code == 1 and "FAIL" in r.stdout


@pytest.mark.parametrize("ret, found", [("o.to(torch.complex64)", "expected a real float dtype, found complex64"),
                                        ("torch.empty_like(o, device='meta')", "found a meta tensor"),
                                        ("o[:, :-1]", "expected shape [1,16,1,8] (the dump's), found [1,15,1,8]")])
def test_an_output_kdadbg_cannot_compare_is_one_line(tmp_path, ret, found):
    """User trial, round 40: a complex o was compared on its real part (torch's warning aside), a meta o
    raised a traceback from the metrics; each is one line naming the implementation and the output, exit 2."""
    dump = _dump(tmp_path)
    impl = tmp_path / "impl.py"
    impl.write_text("import sys, torch\nsys.path.insert(0, %r)\nfrom tests.impls.torch_kda import chunk_kda as _k\n\n"
                    "def odd(*a, **k):\n    o, ht = _k(*a, **k)\n    return %s, ht\n" % (str(REPO), ret))
    r = kdadbg("run", dump, "--impl", f"{impl}:odd", "--device", "cpu")
    lines = [x for x in r.stderr.strip().splitlines() if x.startswith("error")]   # (the progress lines aside)
    assert r.exit_code == 2 and len(lines) == 1 and found in lines[0], r.output
    assert "Traceback" not in r.output
    assert f"{impl}:odd" in lines[0] and "output 'o'" in lines[0]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("how", ["raised", "swallowed"])
def test_ctrl_c_exits_130_with_one_line_even_when_a_finalizer_swallows_it(tmp_path, how):
    """User trial, round 40: a Ctrl-C that arrived while Python ran a finalizer was printed as "Exception
    ignored ... KeyboardInterrupt" and lost, and diff went on to exit 0; one raised plainly exited 130 with
    nothing said. Both exit 130 with one line."""
    dump = _dump(tmp_path)
    impl = tmp_path / "impl.py"
    impl.write_text("import os, signal, sys\nsys.path.insert(0, %r)\nfrom tests.impls.torch_kda import chunk_kda as _k\n\n"
                    "class Bomb:\n    def __del__(self):\n        os.kill(os.getpid(), signal.SIGINT)\n\n"
                    "def raised(*a, **k):\n    raise KeyboardInterrupt\n\n"
                    "def swallowed(*a, **k):\n    Bomb()\n    return _k(*a, **k)\n" % str(REPO))
    js = tmp_path / "r.json"
    js.write_text('{"verdict": "pass"}')   # an earlier run's
    r = kdadbg("run", dump, "--impl", f"{impl}:{how}", "--device", "cpu", "--json", js, "--force")
    lines = [x for x in r.stderr.splitlines() if x.startswith("error")]
    assert r.exit_code == 130 and len(lines) == 1 and "interrupted (SIGINT)" in lines[0], r.output
    if how == "raised":   # interrupted before the result: --json says so, never the earlier "pass"
        import json
        doc = json.loads(js.read_text())
        assert doc["verdict"] == "error" and doc["exit"] == 130 and "interrupted" in doc["error"], doc
    import signal
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # the handler is put back


@pytest.mark.parametrize("command", ["run", "diff"])
def test_a_failed_command_leaves_an_error_document_not_a_stale_verdict(tmp_path, command):
    """User trial, round 40: `run --json r.json --force` with an implementation that raised exited 1 and left
    the previous run's r.json, "verdict": "pass", for a CI script to read. The --json file now says the
    command failed, with its error and exit code; no other output is written."""
    import json

    dump = _dump(tmp_path)
    impl = tmp_path / "impl.py"
    impl.write_text("import sys\nsys.path.insert(0, %r)\nfrom tests.impls.torch_kda import chunk_kda as ok\n\n"
                    "def boom(*a, **k):\n    raise RuntimeError('boom from my kernel')\n" % str(REPO))
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    extra = ["--window", "0"] if command == "diff" else []
    r = kdadbg(command, dump, "--impl", f"{impl}:ok", "--json", js, *extra, "--device", "cpu")
    assert r.exit_code == 0 and json.loads(js.read_text())["verdict"] == "pass", r.output
    r = kdadbg(command, dump, "--impl", f"{impl}:boom", "--json", js, "--plot", png, "--force", *extra,
               "--device", "cpu")
    doc = json.loads(js.read_text())
    assert r.exit_code == 1 and doc["verdict"] == "error" and doc["exit"] == 1, (r.output, doc)
    assert "boom from my kernel" in doc["error"] and doc["schema"] >= 5 and not png.exists()
    # the fixed rerun to the same paths replaces the error document without --force, and says so
    r = kdadbg(command, dump, "--impl", f"{impl}:ok", "--json", js, "--plot", png, *extra, "--device", "cpu")
    assert r.exit_code == 0 and json.loads(js.read_text())["verdict"] == "pass" and png.exists(), r.output
    assert "held the error document of an earlier failed run" in " ".join(r.stderr.split()), r.stderr
    # a result file is not an error document: the next rerun still needs --force, and leaves it whole
    before = js.read_text()
    r = kdadbg(command, dump, "--impl", f"{impl}:ok", "--json", js, *extra, "--device", "cpu")
    assert r.exit_code == 2 and "already exists" in r.stderr and js.read_text() == before, r.output


def test_only_kdadbgs_own_error_document_is_replaced_without_force(tmp_path):
    """The rule behind the rerun above, on the files it must not take for an error document."""
    import json

    from kdadbg.outputs import is_error_document

    doc = {"schema": 5, "verdict": "error", "error": "boom", "exit": 1}
    cases = {"error.json": (json.dumps(doc), True), "result.json": (json.dumps({**doc, "tensors": []}), False),
             "pass.json": (json.dumps({**doc, "verdict": "pass"}), False), "list.json": ("[1]", False),
             "text.json": ("not json", False), "number.json": (json.dumps({**doc, "error": 3}), False)}
    for name, (text, expected) in cases.items():
        (tmp_path / name).write_text(text)
        assert is_error_document(tmp_path / name) is expected, name
    (tmp_path / "link.json").symlink_to(tmp_path / "error.json")
    assert not is_error_document(tmp_path / "link.json") and not is_error_document(tmp_path / "missing.json")


def test_taps_json_stays_parseable_when_the_implementation_prints(tmp_path):
    """User trial, round 40: `taps --source mine.py:noisy --json | python -m json.tool` failed on the
    implementation's own print on stdout. With --json, what it prints goes to stderr."""
    import json

    dump = _dump(tmp_path)
    impl = tmp_path / "impl.py"
    impl.write_text("import sys\nsys.path.insert(0, %r)\nfrom tests.impls.torch_kda import chunk_kda as _k\n\n"
                    "def noisy(*a, **k):\n    print('DEBUG: my kernel prints to stdout')\n    return _k(*a, **k)\n"
                    % str(REPO))
    r = kdadbg("taps", dump, "-o", tmp_path / "t.safetensors", "--source", f"{impl}:noisy", "--json",
               "--device", "cpu")
    assert r.exit_code == 0 and json.loads(r.stdout)["schema"] == 2, r.output
    assert "DEBUG: my kernel prints to stdout" in r.stderr


def test_a_file_or_folder_made_read_only_is_refused_as_root_too(tmp_path):
    """User trial, round 40: as root (a CI container's usual user) `--force` replaced a mode-444 file and
    `taps` wrote into a mode-555 folder, which the README says are refused: os.access is true for root on
    anything. The mode bits are checked too."""
    dump = _dump(tmp_path)
    ro = _existing(tmp_path, "ro.json")
    os.chmod(ro, 0o444)
    folder = _mkdir(tmp_path, "ro_dir")
    os.chmod(folder, 0o555)
    try:
        r = kdadbg("run", dump, "--json", ro, "--force", "--device", "cpu")
        assert r.exit_code == 2 and "is read-only (mode 444)" in r.stderr and ro.read_bytes() == b"keep me", r.output
        r = kdadbg("taps", dump, "-o", folder / "t.safetensors", "--device", "cpu")
        assert r.exit_code == 2 and "is not writable (mode 555)" in r.stderr and not list(folder.iterdir()), r.output
    finally:
        os.chmod(ro, 0o644)
        os.chmod(folder, 0o755)


@pytest.mark.parametrize("env, fragment", [
    pytest.param({"KDADBG_REC_BV": "wide"}, "KDADBG_REC_BV: expected an integer, found 'wide'", id="not-an-integer"),
    pytest.param({"KDADBG_FWD_FUSE_WU": "1", "KDADBG_BWD_FWD_OPERANDS": "3"},
                 "KDADBG_FWD_FUSE_WU=1 with KDADBG_BWD_FWD_OPERANDS bit 2", id="knobs-that-exclude-each-other"),
    pytest.param({"KDADBG_FWD_FUSE_WU": "3"}, "KDADBG_FWD_FUSE_WU=3: expected 0 (off), 1 (on) or 2", id="not-a-mode"),
])
def test_a_kernel_knob_the_kernels_refuse_is_one_error_line(tmp_path, env, fragment):
    """A ``KDADBG_*`` knob our kernels refuse (``tuning.KnobError``) is bad input: ``run`` (as the console
    script runs it) says it on one line naming the variable, exits 2, no traceback, and its ``--json`` file is
    the error document."""
    import json

    dump = _dump(tmp_path)
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "kdadbg", "run", str(dump), "--precision", "bf16", "--json", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=600,
                       env={**os.environ, "TRITON_INTERPRET": "1", **env})
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and fragment in errors[0] and "kernel knob" in errors[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "error" and doc["exit"] == 2 and fragment in doc["error"]
