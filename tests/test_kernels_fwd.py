"""Forward kernels (kernels/chunk.py ``kda_forward``) against the float64 reference and the golden files.

Metric: fla's ratio ``RMS(ref - x) / (RMS(ref) + 1e-8)`` in float64 over the valid rows (padding rows,
and for ``[C, C]`` taps padding columns, are masked). Tolerances come from ``kdadbg.tolerances``.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import DEVICE, GOLDEN, gpu
from kdadbg.cases import get_case, make_inputs, with_size
from kdadbg.config import KDAInputs, parse_config
from kdadbg.compare import compare
from kdadbg.reference import run_reference
from kdadbg.tolerances import TOLERANCES
from kdadbg_kernels.chunk import kda_forward
from kdadbg_kernels.common import TapPlan, chunk_layout
from kdadbg_kernels.taps import REGISTRY, TapSelection

FWD_TAPS = tuple(n for n, t in REGISTRY.items() if t.stage.startswith("fwd"))
# ki = kn exp(-gc) turns the fp32 rounding of gc (relative 6e-8) into a relative error of |gc| * 6e-8:
# up to ~1e-5 at chunk 64. Entries beyond 1e30 are the legitimate fp32 overflow (they may be inf).
TAP_TOL = {**{n: 1e-5 for n in FWD_TAPS}, "ki": 3e-5}
KI_FINITE = 1e30

# Small versions of the shared cases (T <= 130, H <= 2, K, V <= 64), ids are the case names.
CASE_NAMES = ("basic", "t1", "t15", "t16", "tail", "t63", "t65", "varlen_short", "k_ne_v", "v_gt_k", "k8",
              "gate_none", "gate_softplus", "strong_gates", "strong_gates_none", "strong_gates_softplus",
              "zero_gates", "zero_gates_none", "beta_low", "beta_high", "raw", "raw_beta_extremes", "no_state",
              "kv_layout", "varlen_kv", "chunk32", "chunk64", "chunk64_varlen", "chunk64_strong", "bf16")
BF16_CASES = ("basic", "varlen_kv", "chunk32", "chunk64_strong", "bf16", "raw")


def small(name: str):
    case = get_case(name)
    return with_size(case, H=min(case.H, 2)) if case.H > 2 else case


def n_chunks(inputs: KDAInputs, C: int) -> int:
    B, T = inputs.q.shape[:2]
    return int(chunk_layout(B, T, inputs.cu_seqlens, C)[2][-1])


def run_fwd(inputs: KDAInputs, cfg, precision="fp32", taps: TapSelection | None = None, keep_state=True):
    """kda_forward on a dump's tensors; ``ht`` returned in the dump's state layout. ``keep_state=False``: the
    inference forward (no backward to follow)."""
    inputs = inputs.to(DEVICE)
    B, T, H, K, V = inputs.shape
    h0 = inputs.h0
    if h0 is not None and cfg.state_layout == "vk":
        h0 = h0.transpose(-1, -2)
    plan = None
    if taps is not None:
        plan = TapPlan.build(taps, n_chunks(inputs, cfg.chunk_size), H, cfg.chunk_size, K, V, inputs.q.device)
    o, ht, saved, chunks = kda_forward(
        inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta, scale=cfg.scale, chunk_size=cfg.chunk_size,
        gate=cfg.gate, lower_bound=cfg.lower_bound, qk_l2norm=cfg.qk_l2norm, beta_sigmoid=cfg.beta_sigmoid,
        A_log=inputs.A_log, dt_bias=inputs.dt_bias, h0=h0, cu_seqlens=inputs.cu_seqlens, precision=precision,
        tap_plan=plan, keep_state=keep_state)
    if cfg.state_layout == "vk":
        ht = ht.transpose(-1, -2)
    return o, ht, saved, chunks, plan


def tap_mask(name: str, length: torch.Tensor, C: int, ref: torch.Tensor) -> torch.Tensor:
    """Valid part of a chunk-major tap ``[NC, H, *shape]``: rows (and columns) < the chunk's length."""
    m = torch.ones_like(ref, dtype=torch.bool)
    for axis in REGISTRY[name].row_dims:
        shape = [length.numel()] + [1] * (ref.dim() - 1)
        shape[2 + axis] = C
        rows = torch.arange(C).reshape([1] * (2 + axis) + [C] + [1] * (ref.dim() - 3 - axis))
        m = m & (rows < length.reshape(-1, *([1] * (ref.dim() - 1))))
    if name == "ki":
        m = m & (ref.abs() < KI_FINITE)
    return m


def check(name, x, ref, tol, mask=None):
    c = compare(name, x, ref, mask).judge(tol)
    assert c.passed, (f"{name}: ratio {c.ratio:.3e} > {tol:g} (max |err| {c.max_abs:.3e} at {c.max_index}, "
                      f"kernel {c.kernel:.6g} vs ref {c.reference:.6g}, {c.nonfinite} non-finite)")


def check_taps(buffers: dict, ref_taps: dict, length: torch.Tensor, C: int):
    for name in FWD_TAPS:
        ref = ref_taps[name]
        check(name, buffers[name], ref, TAP_TOL[name], tap_mask(name, length, C, ref))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_forward_vs_reference_fp32(name):
    inputs, cfg = make_inputs(small(name))
    o, ht, _, chunks, plan = run_fwd(inputs, cfg, "fp32", TapSelection(names=FWD_TAPS))
    res = run_reference(inputs, cfg, taps=FWD_TAPS)
    tol = TOLERANCES["fp32"]
    check("o", o, res.outputs["o"], tol["o"])
    check("ht", ht, res.outputs["ht"], tol["ht"])
    check_taps(plan.buffers, res.taps, res.chunks.length, cfg.chunk_size)


@pytest.mark.parametrize("name", BF16_CASES)
def test_forward_vs_reference_bf16_mode(name):
    inputs, cfg = make_inputs(small(name))
    o, ht, *_ = run_fwd(inputs, cfg, "bf16")
    res = run_reference(inputs, cfg, taps=())
    tol = TOLERANCES["bf16"]
    check("o", o, res.outputs["o"], tol["o"])
    check("ht", ht, res.outputs["ht"], tol["ht"])


def check_outputs_and_taps(inputs, cfg, precision: str, taps: tuple[str, ...]):
    """o, ht and the given forward taps against the reference (taps at TAP_TOL in fp32 mode, at o's
    tolerance in bf16 mode)."""
    o, ht, _, chunks, plan = run_fwd(inputs, cfg, precision, TapSelection(names=taps))
    res = run_reference(inputs, cfg, taps=taps)
    tol = TOLERANCES[precision]
    check("o", o, res.outputs["o"], tol["o"])
    check("ht", ht, res.outputs["ht"], tol["ht"])
    for name in taps:
        ref = res.taps[name]
        check(name, plan.buffers[name], ref, TAP_TOL[name] if precision == "fp32" else tol["o"],
              tap_mask(name, res.chunks.length, cfg.chunk_size, ref))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("nvb", [None, "1", "2"])
@pytest.mark.parametrize("fuse", ["0", "1"])
def test_output_pass_over_several_v_blocks(precision, nvb, fuse, monkeypatch):
    """V = 160 is three 64-column blocks, the last one part padding: one program for all three (the
    default), one per block (KDADBG_OUT_NVB=1) or two and one (=2). o (formed by the output pass, or by
    the state pass with KDADBG_FWD_FUSE_OUT=1, when the output pass writes taps only) and the output
    pass's taps (S, U, vcorr: written per V block) must match the reference whichever program holds
    which block."""
    if nvb is not None:
        monkeypatch.setenv("KDADBG_OUT_NVB", nvb)
    monkeypatch.setenv("KDADBG_FWD_FUSE_OUT", fuse)
    inputs, cfg = make_inputs(with_size(get_case("varlen_short"), K=16, V=160, H=1))
    check_outputs_and_taps(inputs, cfg, precision, ("S", "U", "vcorr"))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["chunk64_varlen", "varlen_short", "t65"])
def test_state_pass_with_u_loaded_ahead(precision, name, monkeypatch):
    """The state pass's u tile loaded one step ahead into registers (chosen at H32 on the GPU, where
    it buys a pipeline stage; forced here): o, ht and the S, U taps across sequence ends and tails."""
    monkeypatch.setenv("KDADBG_REC_U_AHEAD", "1")
    check_outputs_and_taps(*make_inputs(small(name)), precision, ("S", "U"))


@pytest.mark.parametrize("precision,fuse,lowp", [("fp32", "1", None), ("bf16", "0", None), ("bf16", "1", "0"),
                                                ("bf16", "1", "7"), ("bf16", "1", "15")])
@pytest.mark.parametrize("name", ["chunk64_varlen", "t65", "chunk32"])
def test_state_pass_forming_o(precision, fuse, lowp, name, monkeypatch):
    """o formed in the state pass (KDADBG_FWD_FUSE_OUT=1, the bf16 default) or in the output pass (=0,
    the fp32 default), each with the other precision, and with the state pass's inputs in fp32
    (KDADBG_FWD_LOWP=0), bf16 with tf32 products (=7), all bf16 (=15) or all but u (the default, 11): o, ht and the output
    pass's taps, which it writes alone when the state pass formed o, across sequence ends and tails."""
    monkeypatch.setenv("KDADBG_FWD_FUSE_OUT", fuse)
    if lowp is not None:
        monkeypatch.setenv("KDADBG_FWD_LOWP", lowp)
    check_outputs_and_taps(*make_inputs(small(name)), precision, ("qd", "S", "U", "vcorr"))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_forward_half_inputs(dtype):
    inputs, cfg = make_inputs(with_size(get_case("basic"), dtype=dtype, K=20, V=40, T=37))
    o, ht, *_ = run_fwd(inputs, cfg, "fp32")
    res = run_reference(inputs, cfg, taps=())
    check("o", o, res.outputs["o"], 1e-5)
    check("ht", ht, res.outputs["ht"], 1e-5)


@pytest.mark.parametrize("name", ["golden_basic", "golden_varlen_kv", "golden_softplus_c32_bf16"])
def test_forward_vs_golden(name):
    path = GOLDEN / f"{name}.safetensors"
    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    inputs = KDAInputs(**{n: tensors.get(n) for n in KDAInputs.TENSORS})
    cfg = parse_config(meta, inputs.q.shape[-1], inputs.A_log is not None)
    exp = load_file(str(GOLDEN / f"{name}.expected.safetensors"))
    o, ht, _, _, plan = run_fwd(inputs, cfg, "fp32", TapSelection(names=FWD_TAPS))
    check("o", o, exp["o"], 1e-5)
    check("ht", ht, exp["ht"], 1e-5)
    check_taps(plan.buffers, {n: exp[f"tap.{n}"] for n in FWD_TAPS}, exp["chunk.len"], cfg.chunk_size)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("name,precision", [("basic", "fp32"), ("chunk64_varlen", "fp32"), ("varlen_kv", "bf16")])
def test_taps_do_not_change_results(name, precision):
    inputs, cfg = make_inputs(small(name))
    o0, ht0, s0, *_ = run_fwd(inputs, cfg, precision)
    o1, ht1, s1, *_ = run_fwd(inputs, cfg, precision, TapSelection(names=FWD_TAPS))
    assert torch.equal(bits(o0), bits(o1))
    assert torch.equal(bits(ht0), bits(ht1))
    for field in ("qn", "kn", "gc", "gT", "b", "INV", "Mqk", "S", "U"):
        assert torch.equal(bits(getattr(s0, field)), bits(getattr(s1, field))), field


@pytest.mark.parametrize("name,precision,K", [("chunk64_varlen", "bf16", 40), ("kimi_c64", "bf16", 32),
                                               ("basic", "fp32", 24)])
def test_token_kernel_loads_ahead_and_unrolled_keep_every_bit(name, precision, K, monkeypatch):
    """The token kernel's launch-only knobs PREP_AHEAD (the next K block's q, k, g loaded one step ahead)
    and PREP_UNROLL (its K-block loops unrolled), each against the default: every forward
    output, saved tensor and tap has the same bits. K not a multiple of the K block (40 over blocks of 16
    with the gate and l2norm at chunk 64) puts masked padding columns in the last block."""
    inputs, cfg = make_inputs(with_size(small(name), K=K))
    sel = TapSelection(names=FWD_TAPS)
    monkeypatch.setenv("KDADBG_PREP_BK", "16")
    base = run_fwd(inputs, cfg, precision, sel)
    compared = 0
    for env in ({"KDADBG_PREP_AHEAD": "0", "KDADBG_PREP_UNROLL": "0"}, {"KDADBG_PREP_AHEAD": "1"},
                {"KDADBG_PREP_UNROLL": "2"},
                {"KDADBG_PREP_AHEAD": "1", "KDADBG_PREP_UNROLL": "8"}):
        with monkeypatch.context() as mp:
            for n, x in env.items():
                mp.setenv(n, x)
            o, ht, saved, *_, plan = run_fwd(inputs, cfg, precision, sel)
        assert torch.equal(bits(o), bits(base[0])) and torch.equal(bits(ht), bits(base[1])), env
        for field in ("qn", "kn", "gc", "gT", "b", "INV", "Mqk", "S", "U"):
            a, b = getattr(saved, field), getattr(base[2], field)
            assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), (env, field)
        for tap in FWD_TAPS:
            a, b = plan.buffers[tap], base[-1].buffers[tap]
            assert a.numel() > 0 and torch.equal(bits(a), bits(b)), (env, tap)
            compared += a.numel()
    assert compared > 4 * 1000


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_tap_selection_writes_exactly_the_selected_slots(precision):
    """A window of chunks 2-4 and head 1: exactly those slots are written, with the bits of a run that
    taps everything, and o keeps the bits of a run without taps (in bf16 mode the state pass forms o and
    the output pass runs over the window alone, for the S, U and vcorr taps)."""
    inputs, cfg = make_inputs(with_size(get_case("basic"), T=50))  # B=2: 8 chunks, H=2
    o_off, *_ = run_fwd(inputs, cfg, precision)
    *_, full = run_fwd(inputs, cfg, precision, TapSelection(names=FWD_TAPS))
    sel = TapSelection(names=("gc", "ki", "L", "S", "vcorr", "U"), chunks=(2, 5), heads=(1,))
    o_part, *_, part = run_fwd(inputs, cfg, precision, sel)
    assert torch.equal(bits(o_part), bits(o_off))
    for name in sel.names:
        buf = part.buffers[name]
        assert buf.shape[:2] == (3, 1), name
        assert not torch.isnan(buf).any(), f"{name}: unwritten elements in the selected slots"
        assert torch.equal(bits(buf), bits(full.buffers[name][2:5, 1:2])), name
    for name in FWD_TAPS:
        assert not torch.isnan(full.buffers[name]).any(), f"{name}: unwritten elements with every slot selected"


def test_tap_selection_empty_range_and_head_order():
    inputs, cfg = make_inputs(get_case("basic"))
    *_, empty = run_fwd(inputs, cfg, "fp32", TapSelection(names=FWD_TAPS, chunks=(3, 3)))
    assert all(b.numel() == 0 for b in empty.buffers.values())
    *_, full = run_fwd(inputs, cfg, "fp32", TapSelection(names=("qd", "S")))
    *_, swapped = run_fwd(inputs, cfg, "fp32", TapSelection(names=("qd", "S"), heads=(1, 0)))
    for name in ("qd", "S"):
        assert torch.equal(bits(swapped.buffers[name]), bits(full.buffers[name].flip(1))), name


def test_strong_gates_stay_finite_at_every_chunk_size():
    for C in (16, 32, 64):
        inputs, cfg = make_inputs(with_size(get_case("strong_gates"), chunk_size=C, T=100, H=1))
        o, ht, saved, *_ = run_fwd(inputs, cfg, "bf16")
        for name, t in (("o", o), ("ht", ht), ("INV", saved.INV), ("Mqk", saved.Mqk), ("U", saved.U)):
            assert torch.isfinite(t).all(), f"chunk {C}: {name} not finite"


def test_rejects_bad_inputs():
    inputs, cfg = make_inputs(get_case("basic"))
    with pytest.raises(ValueError, match="chunk_size"):
        kda_forward(inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta, scale=0.25, chunk_size=48)
    with pytest.raises(ValueError, match="A_log"):
        kda_forward(inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta, scale=0.25, gate="lower_bound")
    with pytest.raises(ValueError, match="cu_seqlens"):
        kda_forward(inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta, scale=0.25,
                    cu_seqlens=torch.tensor([0, 10, 40]))


@gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("C", [16, 64])
def test_forward_gpu_large(precision, C):
    case = with_size(get_case("varlen"), chunk_size=C, K=128, V=128, H=4, dtype="bfloat16")
    inputs, cfg = make_inputs(case)
    inputs = inputs.to("cuda")
    o, ht, *_ = run_fwd(inputs, cfg, precision)
    res = run_reference(inputs, cfg, taps=(), device="cuda")
    tol = TOLERANCES[precision]
    check("o", o, res.outputs["o"], tol["o"])
    check("ht", ht, res.outputs["ht"], tol["ht"])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["chunk64_varlen", "gate_softplus", "bf16"])
@pytest.mark.parametrize("mode,dtype", [("default", torch.float16), ("2", torch.float16), ("1", torch.bfloat16)])
def test_normalised_qk_stored_in_low_precision(precision, name, mode, dtype, monkeypatch):
    """PREP_QK_LOWP: in bf16 mode with l2norm, qn and kn are stored in fp16 (by default and with 2) or bf16
    (1), the fp32 values of PREP_QK_LOWP=0 rounded to nearest once (every later use reads the rounded
    values), and o, ht and the taps that use them stay within bf16 mode's tolerances; fp32 mode keeps the
    l2norm's fp32 values (as row scales, prepare.qk_rowscale) and every bit either way. bf16 mode's inference
    forward keeps row scales instead (prepare.rowscale_for_inference), each reader rounding as the mode says:
    o and ht then have the training forward's bits, in each mode."""
    inputs, cfg = make_inputs(small(name))
    assert cfg.qk_l2norm
    monkeypatch.setenv("KDADBG_PREP_QK_LOWP", "0")
    base = run_fwd(inputs, cfg, precision)
    monkeypatch.delenv("KDADBG_PREP_QK_LOWP")
    if mode != "default":
        monkeypatch.setenv("KDADBG_PREP_QK_LOWP", mode)
    o, ht, saved, *_ = run_fwd(inputs, cfg, precision)
    if precision == "bf16":  # stored rounded, no row scales; fp32 with the knob at 0
        assert saved.qn.dtype == saved.kn.dtype == dtype and saved.rq is None
        assert base[2].qn.dtype == torch.float32 and base[2].rq is None
        # the fp32 values rounded to nearest once: what torch's conversion gives
        assert torch.equal(saved.qn, base[2].qn.to(dtype)) and torch.equal(saved.kn, base[2].kn.to(dtype))
    else:  # fp32 mode: the row scales, the raw inputs as they are, whatever the knob
        assert saved.rq is not None and saved.qn.dtype == inputs.q.dtype and base[2].rq is not None
        assert torch.equal(o, base[0]) and torch.equal(ht, base[1])
    check_outputs_and_taps(inputs, cfg, precision, ("qd", "kd", "kr", "Mqk", "INV"))
    o_r, ht_r, saved_r, *_ = run_fwd(inputs, cfg, precision, keep_state=False)
    assert saved_r.rq is not None and saved_r.qn.dtype == inputs.q.dtype
    assert torch.equal(o_r, o) and torch.equal(ht_r, ht)
