"""``--impl flashkda``: the workspace layouts and conversions on synthetic buffers built from the float64
reference's taps (CPU), ``supports()``/``config_for`` and build detection; the real kernels on a GPU with
a FlashKDA build on ``PYTHONPATH`` (skipped otherwise)."""

import math
import sys
import types

import pytest
import torch

from kdadbg.cases import get_case, make_inputs, with_size
from kdadbg.config import KDAConfig
from kdadbg.errors import KdadbgError
from kdadbg.impls import flashkda_convert as fc
from kdadbg.impls import resolve_impl
from kdadbg.impls.base import shapes_of
from kdadbg.impls.flashkda import FlashKDA, find_build
from kdadbg.reference import run_reference

LN2 = math.log(2.0)
FWD_TAPS = ("gc", "gT", "qd", "kd", "ki", "kr", "INV", "Mqk", "S")
BWD_TAPS = ("dkd", "dqd", "dki", "dkr", "dgT", "db", "dgc")

CASES = [
    pytest.param("basic", dict(B=2, T=40), id="batched-tail-h0"),
    pytest.param("varlen_short", dict(T=33), id="varlen-short"),
]


def _dump(preset, size):
    case = with_size(get_case(preset), H=2, K=128, V=128, dtype="bfloat16", **size)
    return make_inputs(case, 0)


def _flashkda_buffers(ref, inputs, tiles, build):
    """FlashKDA-convention buffers ``[H, tiles, ...]`` from the reference's float64 taps: bf16 storage,
    log2 gates (g_cumsum = gc / ln2, g_total = 2^(gT / ln2)), [V,K] states, garbage in padding rows and
    NaN in phantom tiles, as the kernels leave them."""
    H = inputs.shape[2]
    n = ref.chunks.n_chunks

    def place(t, dtype, garbage=0.0):
        t = t.clone()
        for c, length in enumerate(ref.chunks.length.tolist()):
            if garbage is not None and t.ndim >= 4 and t.shape[2] == fc.CHUNK:
                t[c, :, length:] = garbage
        out = torch.full((H, tiles, *t.shape[2:]), float("nan"), dtype=torch.float64)
        out[:, :n] = t.transpose(0, 1)
        return out.to(dtype)

    taps = ref.taps
    bufs = {name: place(taps[name], torch.bfloat16) for name in ("kd", "kr", "INV", "Mqk")}
    bufs["qd"] = place(taps["qd"], torch.bfloat16, garbage=7.0)   # q is not zeroed past n_valid
    bufs["g_total"] = place(torch.exp2(taps["gT"] / LN2), torch.float32)
    if build != "upstream":
        bufs["ki"] = place(taps["ki"], torch.bfloat16)
        gc = taps["gc"].clone()
        for c, length in enumerate(ref.chunks.length.tolist()):   # padding rows keep the last cumsum
            gc[c, :, length:] = gc[c, :, length - 1:length]
        bufs["g_cumsum"] = place(gc / LN2, torch.float32, garbage=None)
        bufs["S"] = place(taps["S"].transpose(-1, -2), torch.bfloat16)
        for name in BWD_TAPS:
            bufs[name] = place(taps[name], torch.float32)
    return bufs


def _pack(bufs, sections, H, tiles):
    """A flat uint8 workspace with the sections at the byte offsets of the CUDA source."""
    ws = torch.zeros(fc.section_nbytes(sections, H * tiles) + 64, dtype=torch.uint8)
    off = 0
    for name, dt, shape in sections:
        t = bufs.get(name, torch.zeros(H, tiles, *shape, dtype=dt)).to(dt).contiguous()
        raw = t.reshape(-1).view(torch.uint8)
        ws[off:off + raw.numel()] = raw
        off += raw.numel()
    return ws


def test_section_offsets_match_the_cuda_source():
    """Byte offsets of each section, per tile slot, as fwd_launch.cu / bwd_launch.cu compute them."""
    def offsets(sections):
        out, off = {}, 0
        for name, dt, shape in sections:
            out[name] = off
            off += math.prod(shape) * torch.empty((), dtype=dt).element_size()
        return out, off

    up, up_total = offsets(fc.FWD_SECTIONS["upstream"])
    assert up == {"kd": 0, "qd": 4096, "kr": 8192, "g_total": 12288, "INV": 12800, "Mqk": 13312}
    assert up_total == 3 * 16 * 128 * 2 + 128 * 4 + 2 * 16 * 16 * 2            # flash_kda.cpp per_tile_bytes
    fork, fork_total = offsets(fc.FWD_SECTIONS["fork"])
    assert fork == {"kd": 0, "qd": 4096, "kr": 8192, "ki": 12288, "g_total": 16384, "INV": 16896, "Mqk": 17408,
                    "g_cumsum": 17920, "kd_fp32": 26112, "qd_fp32": 34304, "ki_fp32": 42496, "kr_fp32": 50688}
    assert fork_total == 58880                                                   # WorkspaceSizes::kPerTile
    bwd, bwd_total = offsets(fc.BWD_SECTIONS)
    assert bwd["dv"] == 4 * 8192 and bwd["dgT"] == 4 * 8192 + 4096 and bwd["db"] == bwd["dgT"] + 512
    assert bwd_total == 4 * 16 * 128 * 4 + 16 * 128 * 2 + 128 * 4 + 16 * 4 + 16 * 128 * 4   # get_bwd_workspace_size


def test_split_reads_sections_at_their_offsets():
    H, tiles = 2, 3
    sections = fc.FWD_SECTIONS["upstream"]
    bufs = {name: torch.randn(H, tiles, *shape).to(dt) for name, dt, shape in sections}
    got = fc.split_workspace(_pack(bufs, sections, H, tiles), sections, H, tiles)
    for name in bufs:
        assert torch.equal(got[name], bufs[name]), name
    with pytest.raises(ValueError, match="workspace"):
        fc.split_workspace(torch.zeros(10, dtype=torch.uint8), sections, H, tiles)


@pytest.mark.parametrize("build", ["upstream", "fork+patch"])
@pytest.mark.parametrize("preset,size", CASES)
def test_converted_buffers_equal_the_reference_taps(preset, size, build):
    inputs, config = _dump(preset, size)
    ref = run_reference(inputs, config, taps=FWD_TAPS + BWD_TAPS)
    B, T, H, K, V = inputs.shape
    tiles = fc.total_tiles(B, T, inputs.n_seqs, inputs.cu_seqlens is not None)
    assert tiles >= ref.chunks.n_chunks
    bufs = _flashkda_buffers(ref, inputs, tiles, build)
    sections = fc.FWD_SECTIONS["fork" if build != "upstream" else "upstream"]
    split = fc.split_workspace(_pack(bufs, sections, H, tiles), sections, H, tiles)
    if build != "upstream":
        split.update(fc.split_workspace(_pack(bufs, fc.BWD_SECTIONS, H, tiles), fc.BWD_SECTIONS, H, tiles))
        split["S"] = bufs["S"]
    taps = fc.convert(split, ref.chunks.length, fc.BUILD_TAPS[build])
    assert set(taps) == set(fc.BUILD_TAPS[build])
    fc.check_shapes(taps, ref.chunks.n_chunks, H)
    for name, t in taps.items():
        want = ref.taps[name]
        bf16 = fc.TAP_SOURCES[name][1].find("bf16") >= 0
        rtol = 2 ** -8 if bf16 else 1e-6
        atol = 1e-6 * max(1.0, float(want.abs().max()))
        assert torch.isfinite(t).all(), name
        torch.testing.assert_close(t, want, rtol=rtol, atol=atol, msg=lambda m: f"{name} ({build}): {m}")


def test_gT_of_the_upstream_build_is_the_log_of_g_total():
    """upstream keeps only 2^Gt (exponentiated before its store): gT = ln(g_total)."""
    G2 = -torch.rand(1, 2, 128, dtype=torch.float64) * 115.0                 # log2 units, down to 16 x lb
    gT = fc.convert({"g_total": torch.exp2(G2).float()}, torch.tensor([16, 5]), ["gT"])["gT"]
    assert gT.shape == (2, 1, 128)
    torch.testing.assert_close(gT, (G2 * LN2).transpose(0, 1), rtol=0, atol=1e-6)


def test_registry_taps_are_each_sourced_or_explained():
    from kdadbg_kernels.taps import TAP_NAMES

    assert set(fc.TAP_SOURCES) | set(fc.NEVER_STORED) == set(TAP_NAMES)
    assert not set(fc.TAP_SOURCES) & set(fc.NEVER_STORED)
    for build, names in fc.BUILD_TAPS.items():
        assert set(names) <= set(fc.TAP_SOURCES), build


def _cfg(**kw):
    return KDAConfig(scale=128 ** -0.5, gate="lower_bound", **kw)


SHAPES = {"B": 1, "T": 64, "H": 2, "K": 128, "V": 128, "N": 1, "varlen": False, "dtype": "bfloat16",
          "has_h0": False, "has_dht": False}


@pytest.mark.parametrize("config,shapes,why", [
    pytest.param(_cfg(), {**SHAPES, "K": 64}, "K = V = 128, found K=64", id="K64"),
    pytest.param(_cfg(), {**SHAPES, "V": 100}, "K = V = 128, found K=128, V=100", id="V100"),
    pytest.param(KDAConfig(scale=0.1, gate="softplus"), SHAPES, "only the lower-bound gate", id="softplus"),
    pytest.param(_cfg(qk_l2norm=False), SHAPES, "qk_l2norm off", id="no-l2norm"),
    pytest.param(_cfg(), {**SHAPES, "dtype": "float32"}, "bf16 q, k, v, g, beta, found float32", id="fp32"),
    pytest.param(_cfg(chunk_size=64), SHAPES, "16-token chunks", id="chunk64"),
    pytest.param(_cfg(), {**SHAPES, "HV": 4}, "no GVA), found H=2, HV=4", id="gva"),
])
def test_supports_states_what_flashkda_needs(config, shapes, why):
    ok, msg = FlashKDA().supports(config, shapes)
    assert not ok and why in msg


def test_a_dump_at_another_chunk_size_is_compared_at_16():
    impl = FlashKDA()
    cfg, note = impl.config_for(_cfg(chunk_size=64))
    assert cfg.chunk_size == 16 and "compared at chunk 16" in note
    assert impl.config_for(_cfg()) == (_cfg(), None)


def _fake_modules(monkeypatch, *, bwd: bool, patched: bool):
    c = types.ModuleType("flash_kda_C")
    c.fwd = c.get_workspace_size = lambda *a, **k: None
    if bwd:
        c.bwd = c.fwd
    if patched:
        c.get_bwd_workspace_size = c.fwd
    pkg = types.ModuleType("flash_kda")
    pkg.__file__ = "/somewhere/flash_kda/__init__.py"
    monkeypatch.setitem(sys.modules, "flash_kda_C", c)
    monkeypatch.setitem(sys.modules, "flash_kda", pkg)
    if bwd:
        monkeypatch.setitem(sys.modules, "flash_kda.autograd", types.ModuleType("flash_kda.autograd"))


@pytest.mark.parametrize("bwd,patched,build", [(False, False, "upstream"), (True, False, "fork"),
                                               (True, True, "fork+patch")])
def test_build_detection(monkeypatch, bwd, patched, build):
    _fake_modules(monkeypatch, bwd=bwd, patched=patched)
    assert find_build() == (build, "/somewhere/flash_kda/__init__.py")
    impl = resolve_impl("flashkda")
    assert impl.describe()["build"] == build and impl.describe()["taps"] == list(fc.BUILD_TAPS[build])
    assert impl.supports(_cfg(), SHAPES) == (True, "")


def test_without_a_build_supports_says_how_to_get_one(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_kda", None)   # import fails
    ok, why = FlashKDA().supports(_cfg(), SHAPES)
    assert not ok and "not importable" in why and "build_flashkda.sh" in why


def test_run_refuses_the_cpu(monkeypatch):
    _fake_modules(monkeypatch, bwd=True, patched=True)
    inputs, config = _dump("kimi", dict(T=20))
    with pytest.raises(KdadbgError, match="CUDA only"):
        FlashKDA().run(inputs, config, device="cpu")


def test_diff_refuses_an_unsupported_dump_in_one_line():
    from kdadbg.diff import diff_dump

    inputs, config = make_inputs(get_case("basic"))      # K = 16, float32
    with pytest.raises(KdadbgError, match=r"--impl flashkda: cannot run this dump: FlashKDA requires K = V = 128"):
        diff_dump(inputs, config, resolve_impl("flashkda"), noise_floor=False)


# GPU: the real kernels (skip without a CUDA device and a FlashKDA build on PYTHONPATH)

def _gpu_build():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    build, where = find_build()
    if build is None:
        pytest.skip(where)
    return build


@pytest.mark.parametrize("preset,size", [pytest.param("kimi", dict(T=100), id="kimi"),
                                         pytest.param("basic", dict(B=2, T=40), id="batched-h0-dht"),
                                         pytest.param("kimi_varlen", dict(), id="varlen")])
def test_gpu_outputs_and_taps_within_bf16(preset, size):
    from kdadbg.compare import compare
    from kdadbg.tolerances import tap_tolerances, tolerances

    build = _gpu_build()
    inputs, config = _dump(preset, size)
    impl = FlashKDA()
    assert impl.supports(config, shapes_of(inputs)) == (True, "")
    from kdadbg_kernels.taps import TapSelection

    run = impl.run(inputs, config, device="cuda", taps=TapSelection())
    ref = run_reference(inputs, config, taps=fc.BUILD_TAPS[build], device="cuda")
    tol = tolerances("bf16")
    assert set(run.outputs) >= {"o", "ht"}
    for name in ("o", "ht", "dq", "dk", "dv", "dbeta", "dh0"):
        if name in run.outputs and name in ref.outputs:
            c = compare(name, run.outputs[name], ref.outputs[name])
            # FlashKDA's own numerics (fp16 Neumann inverse, bf16 state) put o at 5.5-6.0e-3 on the H200,
            # over fla's 5e-3 bar (shared/peers.md: 5.9e-3): the adapter is judged within twice the bar
            assert c.nonfinite == 0 and c.ratio <= 2 * tol[name], (name, c.ratio)
    assert any("the same bits" in n for n in run.notes), run.notes
    ttol = tap_tolerances("bf16")
    assert set(run.taps) == set(fc.BUILD_TAPS[build])
    for name, t in run.taps.items():
        c = compare(name, t, ref.taps[name])
        assert c.nonfinite == 0 and c.ratio <= 5 * ttol[name], (name, c.ratio)
