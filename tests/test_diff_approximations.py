"""``diff A B`` where A is not the float64 reference: both files are approximations, so a correct pair may differ
by up to the sum of both files' tolerances. Cells between the tolerance and that sum are DRIFT (failing only with
--strict), cells beyond it stay BUG; where A is the float64 reference nothing changes (fla_layer, bf16, chunk 64:
two correct bf16 files differed by 5.1e-3 in o against 5e-3, BUG in `diff A B` while `diff DUMP --against` passed
each of them)."""

import json

import pytest
import torch

from conftest import resave
from kdadbg.chunks import chunk_table
from kdadbg.diff import diff_taps_files
from kdadbg.impls import resolve_impl
from kdadbg.impls.reference import Reference
from kdadbg.noise import BUG, DRIFT
from kdadbg.tapsfile import chunk_rows, read_taps_file, taps_metadata, write_taps_file
from kdadbg_kernels.taps import TAP_NAMES, TapSelection
from test_diff import inputs_for

BF16_REFERENCE = "float32 reference, bf16 dots"   # the noise floor's model: a correct bf16 implementation


def write_run(path, impl, inputs, cfg, source, precision, device="cpu", edit=None):
    """``impl``'s outputs and every tap of every chunk and head as a taps file recording ``source`` and
    ``precision``; ``edit(taps)`` changes the taps first."""
    run = impl.run(inputs, cfg, device=device, taps=TapSelection(names=TAP_NAMES))
    taps = {n: t.detach().cpu().clone() for n, t in run.taps.items()}
    if edit is not None:
        edit(taps)
    n_chunks = len(run.tap_chunks)
    ct = chunk_table(*inputs.shape[:2], inputs.cu_seqlens, cfg.chunk_size)
    write_taps_file(path, {n: t.detach().cpu() for n, t in run.outputs.items()}, taps, chunk_rows(ct, 0, n_chunks),
                    run.tap_heads, taps_metadata(source, "fl.safetensors", cfg, precision))
    return path


def bf16_reference():
    return Reference("bf16", torch.float32, torch.bfloat16)


def finite_cell(t: torch.Tensor) -> tuple[int, int]:
    """A chunk × head of tap ``t`` whose every value is finite (the exp(-gc) taps overflow float32 in chunks of strong gates)."""
    ok = torch.isfinite(t).flatten(2).all(-1)
    c, h = ok.nonzero()[0].tolist()
    return c, h


def move(cell: tuple[int, int], ratio: float, name: str = "dkr"):
    """An edit moving tap ``name``'s cell by ``ratio`` of its RMS (``RMS(x - a) / RMS(a) = ratio``)."""
    def edit(taps):
        c, h = cell
        a = taps[name][c, h].to(torch.float64)
        noise = torch.randn(a.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        taps[name][c, h] = (a + ratio * a.pow(2).mean().sqrt() / noise.pow(2).mean().sqrt() * noise).to(
            taps[name].dtype)
    return edit


@pytest.fixture(scope="module")
def fla_layer(tmp_path_factory):
    """fla_layer (T 256, chunk 64) at bf16: A the float32 reference with bf16 dot operands, recording bf16, and
    the dkr cell it moves in B (a tap judged unweighted: ``move`` sets its ratio exactly)."""
    tmp = tmp_path_factory.mktemp("approx")
    inputs, cfg = inputs_for("fla_layer")
    a = write_run(tmp / "a.safetensors", bf16_reference(), inputs, cfg, BF16_REFERENCE, "bf16")
    cell = finite_cell(read_taps_file(a)["taps"]["dkr"])
    return inputs, cfg, tmp, a, cell


def relabelled(src, dst, **metadata):
    resave(src, dst, **metadata)
    return dst


def test_a_cell_within_both_tolerances_is_drift_when_a_is_an_approximation(fla_layer):
    """B's dkr 0.0217 from A's (a user trial saw dkd there), over bf16's 0.02: a BUG before (no dump, no floor), now DRIFT with its reason where
    A records bf16 (the verdict a pass, --strict a fail); where A is the float64 reference it stays a BUG."""
    inputs, cfg, tmp, a, cell = fla_layer
    b = write_run(tmp / "b.safetensors", bf16_reference(), inputs, cfg, "ours", "bf16", edit=move(cell, 0.0217))
    res = diff_taps_files(read_taps_file(a), read_taps_file(b), precision="bf16")
    c = res.cells["dkr"]
    j = c.heads.index(cell[1])
    assert float(c.ratio[cell[0], j]) == pytest.approx(0.0217, rel=1e-3) and c.tol == 0.02
    assert int(c.label[cell[0], j]) == DRIFT and res.counts()["bug"] == 0 and res.verdict == "pass", res.counts()
    assert res.first_divergence["label"] == "DRIFT" and "sum of both tolerances, 0.04" in res.first_divergence["reason"]
    n = res.counts()
    note = next(x for x in res.notes if x.startswith("A ("))
    assert "is not the float64 reference (its metadata: source float32 reference, bf16 dots, precision bf16)" in note
    assert "2 x each cell's tolerance at bf16" in note
    assert f"of the {n['cells']} compared cells, 1 over their tolerance are within that sum" in note, note
    doc = json.loads(json.dumps(res.as_json(), allow_nan=False))
    drift = [x for x in doc["cells"] if x["label"] == "DRIFT"]
    assert len(drift) == 1 and "both files are approximations" in drift[0]["reason"], drift
    assert diff_taps_files(read_taps_file(a), read_taps_file(b), precision="bf16", drift_fails=True).verdict == "fail"
    # A the float64 reference (its metadata says so): judged as ever, every cell over its tolerance a BUG
    ref = relabelled(a, tmp / "a_ref.safetensors", source="reference", precision="float64")
    res = diff_taps_files(read_taps_file(ref), read_taps_file(b), precision="bf16")
    assert int(res.cells["dkr"].label[cell[0], j]) == BUG and res.verdict == "fail"
    note = next(x for x in res.notes if x.startswith("A ("))
    assert "is the float64 reference" in note and f"(1 of the {res.counts()['cells']} compared cells)" in note, note


@pytest.mark.parametrize("ratio", [pytest.param(0.05, id="just-beyond-2x"), pytest.param(0.3, id="far-beyond")])
def test_a_planted_wrong_tap_beyond_both_tolerances_stays_a_bug(fla_layer, ratio):
    """A wrong dkr cell beyond the sum of both files' tolerances (0.04 at bf16) is a BUG whoever wrote A."""
    inputs, cfg, tmp, a, cell = fla_layer
    b = write_run(tmp / f"bad{ratio}.safetensors", bf16_reference(), inputs, cfg, "ours", "bf16",
                  edit=move(cell, ratio))
    res = diff_taps_files(read_taps_file(a), read_taps_file(b), precision="bf16")
    assert res.verdict == "fail" and res.first_bug["tap"] == "dkr" and res.first_bug["chunk"] == cell[0]
    assert res.counts()["bug"] == 1 and res.counts()["drift"] == 0, res.counts()
    note = next(x for x in res.notes if x.startswith("A ("))
    assert "0 over their tolerance are within that sum (DRIFT, failing only with --strict) and 1 beyond it" in note


def test_two_correct_bf16_implementations_pass_diff_a_b(fla_layer, kernel_device):
    """A realistic pair, fla_layer seed 1: the float32 reference with bf16 dot operands as A, our kernels in bf16
    mode as B. Each is within its tolerances of the float64 reference (`diff DUMP --against`), but their
    difference reached 0.0051 in o (tol 5e-3) and 0.00505 as a whole tensor: 7 BUG cells and a failing o before;
    within the sum of both tolerances now."""
    _, _, tmp, _, _ = fla_layer
    inputs, cfg = inputs_for("fla_layer", seed=1)
    a = write_run(tmp / "a1.safetensors", bf16_reference(), inputs, cfg, BF16_REFERENCE, "bf16")
    b = write_run(tmp / "ours1.safetensors", resolve_impl("ours", "bf16"), inputs, cfg, "ours", "bf16",
                  device=kernel_device)
    res = diff_taps_files(read_taps_file(a), read_taps_file(b), precision="bf16")
    n = res.counts()
    assert n["bug"] == 0 and res.verdict != "fail" and not res.tensors_failing, (n, res.tensors)
    over = [(name, c.chunks[r]) for name, c in res.cells.items() for r in range(len(c.chunks))
            if bool((c.label[r] == DRIFT).any())]
    assert all(res.cells[name].drift_reason for name, _ in over)
    assert next(x for x in res.notes if x.startswith("A (")).count(f"of the {n['cells']} compared cells") == 1
