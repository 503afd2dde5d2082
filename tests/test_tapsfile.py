"""Taps file layout: padding zeroing, the writer, the reader's checks, and the README's tap table."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import REPO
from kdadbg.errors import KdadbgError
from kdadbg.render.tables import tap_table_markdown
from kdadbg.tapsfile import read_taps_file, write_taps_file, zero_padding
from kdadbg_kernels.taps import REGISTRY, TAP_NAMES


def test_zero_padding_rows_and_columns():
    lengths = torch.tensor([16, 5, 1])
    x = torch.randn(3, 2, 16, 16)
    x[1, :, 10, 12] = float("nan")  # padding NaN must become 0 too
    y = zero_padding("L", x, lengths)
    for c, n in enumerate(lengths.tolist()):
        assert torch.equal(y[c, :, :n, :n], x[c, :, :n, :n])
        assert (y[c, :, n:, :] == 0).all() and (y[c, :, :, n:] == 0).all()
    assert not torch.isnan(y).any()
    assert torch.equal(x[1, :, 10, 12].isnan(), torch.tensor([True, True]))  # input untouched


@pytest.mark.parametrize("name", ["S", "gT", "b", "U", "dgc"])
def test_zero_padding_only_on_chunk_row_axes(name):
    tap = REGISTRY[name]
    dims = tap.dims(8, 4, 6)
    x = torch.randn(2, 3, *dims)
    y = zero_padding(name, x, [8, 3])
    assert torch.equal(y[0], x[0])
    if not tap.row_dims:
        assert torch.equal(y, x)
    else:
        assert tap.row_dims == (0,)
        assert torch.equal(y[1, :, :3], x[1, :, :3]) and (y[1, :, 3:] == 0).all()


def test_zero_padding_rejects_wrong_rank():
    with pytest.raises(KdadbgError, match="tap 'L'"):
        zero_padding("L", torch.zeros(3, 2, 16), [16, 16, 16])


def _chunks(n, lengths):
    return {"chunk.index": torch.arange(n), "chunk.seq": torch.zeros(n, dtype=torch.long),
            "chunk.start": torch.arange(n) * 16, "chunk.len": torch.tensor(lengths)}


def test_write_then_read(tmp_path):
    C, K, V = 16, 4, 6
    taps = {"L": torch.randn(2, 1, C, C), "S": torch.randn(2, 1, K, V), "b": torch.randn(2, 1, C)}
    outs = {"o": torch.randn(1, 20, 2, V), "dq": torch.randn(1, 20, 2, K)}
    path = write_taps_file(tmp_path / "t.safetensors", outs, taps, _chunks(2, [16, 4]), [1],
                           {"source": "reference", "chunk_size": "16"})
    f = read_taps_file(path)
    assert set(f["taps"]) == {"L", "S", "b"} and set(f["outputs"]) == {"o", "dq"}
    assert f["missing_taps"] == [n for n in TAP_NAMES if n not in ("L", "S", "b")]
    assert f["heads"].tolist() == [1] and f["chunks"]["len"].tolist() == [16, 4]
    assert (f["taps"]["L"][1, :, 4:] == 0).all() and (f["taps"]["L"][1, :, :, 4:] == 0).all()
    assert torch.equal(f["taps"]["S"], taps["S"])
    raw = load_file(path)
    assert all(raw[k].dtype == torch.int64 for k in ("chunk.index", "chunk.len", "head.index"))


def _write(path, tensors, meta=None):
    save_file(tensors, str(path), metadata=meta or {})
    return path


@pytest.mark.parametrize("tensors, fragment", [
    pytest.param({"tap.S": torch.zeros(2, 1, 4, 6), **{k: v for k, v in _chunks(2, [16, 4]).items()
                                                      if k != "chunk.len"}, "head.index": torch.tensor([0])},
                 "tensor 'chunk.len': missing", id="no-chunk-len"),
    pytest.param({"tap.S": torch.zeros(3, 1, 4, 6), **_chunks(2, [16, 4]), "head.index": torch.tensor([0])},
                 "tensor 'tap.S': expected shape [2,1,K,V]", id="tap-rows-vs-chunks"),
    pytest.param({"tap.S": torch.zeros(2, 2, 4, 6), **_chunks(2, [16, 4]), "head.index": torch.tensor([0])},
                 "tensor 'tap.S'", id="tap-heads-vs-head-index"),
    pytest.param({"tap.S": torch.zeros(2, 1, 4, 6), "tap.kd": torch.zeros(2, 1, 16, 5), **_chunks(2, [16, 4]),
                  "head.index": torch.tensor([0])}, "tensor 'tap.S': expected per-chunk shape [K,V] with K=5, found [4,6]",
                 id="inconsistent-K"),
    pytest.param({"tap.b": torch.zeros(2, 1, 32), **_chunks(2, [16, 4]), "head.index": torch.tensor([0])},
                 "with C=16", id="C-vs-metadata"),
    pytest.param({"tap.S": torch.zeros(2, 1, 4, 6), **{**_chunks(2, [16, 4]), "chunk.seq": torch.zeros(3)},
                  "head.index": torch.tensor([0])}, "tensor 'chunk.seq': expected a 1-D integer", id="float-chunk-seq"),
    pytest.param({"tap.S": torch.zeros(2, 1, 4, 6), **{**_chunks(2, [16, 4]), "chunk.seq": torch.zeros(3).long()},
                  "head.index": torch.tensor([0])}, "expected 2 entries", id="chunk-seq-length"),
    pytest.param({"tap.b": torch.zeros(2, 1, 16), **_chunks(2, [16, 17]), "head.index": torch.tensor([0])},
                 "tensor 'chunk.len': expected values in 1..16", id="chunk-len-over-C"),
    pytest.param({"o": torch.zeros(2, dtype=torch.int32)}, "tensor 'o': expected a float dtype", id="int-output"),
])
def test_read_malformed_taps_file(tmp_path, tensors, fragment):
    path = _write(tmp_path / "t.safetensors", tensors, {"chunk_size": "16"})
    with pytest.raises(KdadbgError) as e:
        read_taps_file(path)
    assert str(e.value).startswith(f"{path}: ") and fragment in str(e.value)


def test_read_outputs_only_and_unknown_keys(tmp_path):
    path = _write(tmp_path / "t.safetensors", {"o": torch.zeros(1, 3, 1, 2), "tap.extra": torch.zeros(1)})
    f = read_taps_file(path)
    assert f["taps"] == {} and f["missing_taps"] == list(TAP_NAMES) and f["unknown"] == ["tap.extra"]


def test_readme_tap_table_matches_registry():
    readme = (REPO / "README.md").read_text()
    assert tap_table_markdown() in readme


def test_a_file_made_from_other_inputs_is_refused(tmp_path):
    """Files kdadbg writes from a dump (``taps``, ``run --save``) record its inputs' digest; compared with
    another dump of the same shapes they are refused in one line naming both (exit 2), not reported as a
    BUG in every cell. A file without the digest (another tool's, an older kdadbg's) is taken on trust."""
    from safetensors import safe_open

    from test_cli import assert_one_error_line, kdadbg

    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert kdadbg("gen", a).exit_code == 0 and kdadbg("gen", b, "--seed", "5").exit_code == 0
    ta, sa = tmp_path / "a.taps.safetensors", tmp_path / "a.out.safetensors"
    assert kdadbg("taps", a, "--impl", "reference", "-o", ta).exit_code == 0
    assert kdadbg("run", a, "--impl", "reference", "--save", sa).exit_code == 0
    assert kdadbg("diff", a, "--against", ta).exit_code == 0
    assert kdadbg("run", a, "--impl", sa).exit_code == 0
    for args in (("diff", b, "--against", ta), ("run", b, "--impl", sa), ("diff", b, "--impl", sa)):
        assert_one_error_line(kdadbg(*args), "made from other inputs than this dump", "a.safetensors'")
    with safe_open(str(ta), "pt") as f:
        meta = f.metadata()
    del meta["inputs_sha256"]
    bare = tmp_path / "bare.taps.safetensors"
    save_file(load_file(str(ta)), str(bare), metadata=meta)
    r = kdadbg("diff", b, "--against", bare)
    assert r.exit_code == 1 and "BUG" in r.stdout, r.output


def test_files_of_another_config_or_of_two_dumps_are_refused_and_a_float32_copy_accepted(tmp_path):
    """A file made with another scale (the dump's metadata, or a --scale override) is refused in one line;
    two taps files of different dumps (diff A B) too; a float32 copy of a bf16 dump (the same values, the
    same problem) keeps the digest and is accepted."""
    from safetensors import safe_open

    from test_cli import assert_one_error_line, kdadbg

    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert kdadbg("gen", a).exit_code == 0 and kdadbg("gen", b, "--seed", "5").exit_code == 0
    ta, tb = tmp_path / "a.taps.safetensors", tmp_path / "b.taps.safetensors"
    for d, t in ((a, ta), (b, tb)):
        assert kdadbg("taps", d, "--impl", "reference", "-o", t).exit_code == 0
    with safe_open(str(a), "pt") as f:
        meta = dict(f.metadata())
    x = load_file(str(a))
    scaled = tmp_path / "scaled.safetensors"
    save_file(x, str(scaled), metadata={**meta, "scale": str(2 * float(meta["scale"]))})
    assert_one_error_line(kdadbg("diff", scaled, "--against", ta), "made with another config than this dump's", "scale")
    assert_one_error_line(kdadbg("diff", a, "--against", ta, "--scale", "0.5"), "made with another config")
    # every differing key at once, chunk_size too, with the overrides that give the dump the file's config (user
    # trial, round 45: gate first, then on a rerun with --gate, chunk_size)
    tc = tmp_path / "c.taps.safetensors"
    assert kdadbg("taps", a, "-o", tc, "--gate", "softplus", "--chunk-size", "32", "--no-qk-l2norm",
                  "--taps", "dS").exit_code == 0
    meta_a = {k: meta[k] for k in ("gate", "chunk_size", "qk_l2norm")}
    assert meta_a["gate"] != "softplus" and meta_a["chunk_size"] != "32" and meta_a["qk_l2norm"] == "true", meta_a
    assert_one_error_line(kdadbg("diff", a, "--against", tc), f"gate softplus / {meta_a['gate']}",
                          f"chunk_size 32 / {meta_a['chunk_size']}", "qk_l2norm false / true",
                          "the overrides --gate softplus --no-qk-l2norm --chunk-size 32")
    assert kdadbg("diff", a, "--against", tc, "--gate", "softplus", "--chunk-size", "32",
                  "--no-qk-l2norm").exit_code == 0
    assert_one_error_line(kdadbg("diff", ta, tb), "made from different inputs", "'a.safetensors'", "'b.safetensors'")
    assert kdadbg("diff", ta, ta).exit_code == 0
    bf, bf32 = tmp_path / "bf.safetensors", tmp_path / "bf32.safetensors"
    save_file({k: v.bfloat16() if v.is_floating_point() else v for k, v in x.items()}, str(bf), metadata=meta)
    save_file({k: v.bfloat16().float() if v.is_floating_point() else v for k, v in x.items()}, str(bf32),
              metadata=meta)
    tbf = tmp_path / "bf.taps.safetensors"
    assert kdadbg("taps", bf, "--impl", "reference", "-o", tbf).exit_code == 0
    r = kdadbg("diff", bf32, "--against", tbf)
    assert r.exit_code == 0, r.output


def test_an_export_whose_exp_taps_overflow_float32_says_why(tmp_path):
    """`taps --source ours` on strong gates exits 1 naming ki, dqd, dkd non-finite; it said nothing of why
    (user trial, round 39): a note names the chunks whose cumulative gate passes float32's exp range. A
    finite export has no note."""
    from kdadbg.cases import get_case, make_inputs
    from kdadbg.dump import save_dump
    from kdadbg.export import export_taps
    from test_cli import kdadbg

    inputs, config = make_inputs(get_case("chunk64_strong"))     # every gate at -5, 64 rows: -gc up to 320
    dump = save_dump(tmp_path / "s.safetensors", inputs, config)
    info = export_taps(dump, tmp_path / "s.taps.safetensors", source="ours", names=("ki", "kr"), device="cpu")
    assert info["nonfinite"] == ["ki"], info["nonfinite"]
    assert "ki carry exp(-gc)" in info["overflow_note"] and "chunks 0 of this dump" in info["overflow_note"]
    assert info["nonfinite_explained"]
    # and explained, the export is no failure: exit 0 (it was 1 on every realistic fp32 export: user trial, round 46)
    r = kdadbg("taps", dump, "--source", "ours", "--taps", "ki", "-o", tmp_path / "cli.taps.safetensors")
    assert r.exit_code == 0 and "not by itself a fault (exit 0)" in r.stdout, r.output
    calm, cfg = make_inputs(get_case("basic"))
    dump = save_dump(tmp_path / "b.safetensors", calm, cfg)
    info = export_taps(dump, tmp_path / "b.taps.safetensors", source="ours", names=("ki",), device="cpu")
    assert info["nonfinite"] == [] and info["overflow_note"] is None


def test_a_non_finite_tap_outside_the_chunks_past_exp_range_is_not_explained_by_them():
    """The exp(-gc) note (and exit 0) holds only where every non-finite value of those taps lies in a chunk whose
    cumulative gate passes float32's range: fla_layer's chunks 2 and 3 do; a NaN in chunk 1 is a fault."""
    from kdadbg.cases import get_case, make_inputs
    from kdadbg.chunks import chunk_table
    from kdadbg.export import exp_overflow_note

    inputs, config = make_inputs(get_case("fla_layer"))
    table = chunk_table(inputs.shape[0], inputs.shape[1], inputs.cu_seqlens, config.chunk_size)
    ki = torch.zeros(4, 2, 64, 32)
    ki[3, 1, 5, 7] = float("inf")
    assert exp_overflow_note(["ki"], inputs, config, table, 0, 4, {"ki": ki}) is not None
    ki[1, 0, 0, 0] = float("nan")
    assert exp_overflow_note(["ki"], inputs, config, table, 0, 4, {"ki": ki}) is None
