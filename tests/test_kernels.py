"""The combined forward+backward call (``kda_forward_backward``) and the autograd op ``chunk_kda``
against the float64 reference; taps on/off bit equality of every output and gradient."""

from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, gpu
from kdadbg.cases import get_case, make_inputs, with_size
from kdadbg.compare import compare
from kdadbg.reference import run_reference
from kdadbg.tolerances import TOLERANCES
from kdadbg_kernels import TapSelection, chunk_kda
from kdadbg.tapsfile import zero_padding
from kdadbg_kernels.chunk import kda_forward, kda_forward_backward
from kdadbg_kernels.common import ALIAS_TAPS, KernelChunks, TapPlan, chunk_layout, s_bf16

CASES = ("basic", "varlen_kv", "gate_none", "gate_softplus", "raw", "no_state", "chunk32", "chunk64_varlen", "gva",
         "gva_varlen")


def run_fb(inputs, cfg, precision="fp32", taps=None):
    inputs = inputs.to(DEVICE)
    return kda_forward_backward(
        inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta, inputs.do, dht=inputs.dht, h0=inputs.h0,
        state_layout=cfg.state_layout, cu_seqlens=inputs.cu_seqlens, A_log=inputs.A_log, dt_bias=inputs.dt_bias,
        scale=cfg.scale, chunk_size=cfg.chunk_size, gate=cfg.gate, lower_bound=cfg.lower_bound,
        qk_l2norm=cfg.qk_l2norm, beta_sigmoid=cfg.beta_sigmoid, precision=precision, taps=taps)


def run_op(inputs, cfg, precision="fp32", **kw):
    """chunk_kda with fla's argument names (``kw``: more of them); returns outputs and gradients keyed
    like the reference."""
    inputs = inputs.to(DEVICE)
    leaves = {n: getattr(inputs, n).clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")}
    extra = {}
    if cfg.gate != "none":
        extra = dict(use_gate_in_kernel=True, A_log=inputs.A_log.clone().requires_grad_(True),
                     dt_bias=inputs.dt_bias.clone().requires_grad_(True),
                     lower_bound=cfg.lower_bound if cfg.gate == "lower_bound" else None)
    h0 = inputs.h0.clone().requires_grad_(True) if inputs.h0 is not None else None
    o, ht = chunk_kda(**leaves, scale=cfg.scale, initial_state=h0, output_final_state=True,
                      cu_seqlens=inputs.cu_seqlens, chunk_size=cfg.chunk_size,
                      use_qk_l2norm_in_kernel=cfg.qk_l2norm, use_beta_sigmoid_in_kernel=cfg.beta_sigmoid,
                      state_v_first=cfg.state_layout == "vk", precision=precision, **extra, **kw)
    assert o.dtype == inputs.v.dtype
    loss = (o.float() * inputs.do.float()).sum()
    if inputs.dht is not None:
        loss = loss + (ht * inputs.dht.float()).sum()
    loss.backward()
    out = {"o": o, "ht": ht, **{"d" + n: t.grad for n, t in leaves.items()}}
    if h0 is not None:
        out["dh0"] = h0.grad
    if extra:
        out["dA_log"], out["ddt_bias"] = extra["A_log"].grad, extra["dt_bias"].grad
    return out


def check_all(got: dict, ref: dict, tol: dict):
    assert sorted(got) == sorted(ref)
    for name, r in ref.items():
        c = compare(name, got[name], r).judge(tol[name])
        assert c.passed, f"{name}: ratio {c.ratio:.3e} > {tol[name]:g} ({c.nonfinite} non-finite)"


@pytest.mark.parametrize("name", CASES)
def test_forward_backward_vs_reference(name):
    inputs, cfg = make_inputs(get_case(name))
    out, buffers, plan = run_fb(inputs, cfg)
    assert buffers == {} and plan is None
    check_all(out, run_reference(inputs, cfg, taps=()).outputs, TOLERANCES["fp32"])


@pytest.mark.parametrize("name", ("basic", "varlen_kv", "gate_softplus", "kv_layout", "gva", "gva_varlen"))
def test_autograd_op_vs_reference(name):
    inputs, cfg = make_inputs(get_case(name))
    check_all(run_op(inputs, cfg), run_reference(inputs, cfg, taps=()).outputs, TOLERANCES["fp32"])


@pytest.mark.parametrize("name", ("basic", "chunk64_varlen"))
def test_autograd_op_bf16_mode(name):
    inputs, cfg = make_inputs(get_case(name))
    check_all(run_op(inputs, cfg, "bf16"), run_reference(inputs, cfg, taps=()).outputs, TOLERANCES["bf16"])


@pytest.mark.parametrize("name,precision", [("bf16", "fp32"), ("bf16", "bf16"), ("raw", "bf16"), ("gva", "bf16")])
def test_op_outputs_rounded_in_kernel_like_torch(name, precision):
    """The op writes o and the gradients in the inputs' dtype inside the kernels: the same bits as the
    fp32 results of ``kda_forward_backward`` rounded by ``torch`` (round to nearest even). GVA: dq, dk
    are rounded once, after the float32 group sum."""
    case = get_case(name) if name == "bf16" else with_size(get_case(name), dtype="bfloat16", T=40)
    inputs, cfg = make_inputs(case)
    assert inputs.q.dtype == torch.bfloat16
    op = run_op(inputs, cfg, precision)
    plain, *_ = run_fb(inputs, cfg, precision)
    for n in ("o", "dq", "dk", "dv", "dg", "dbeta"):
        assert op[n].dtype == torch.bfloat16, n
        want = plain[n].to(torch.bfloat16)
        assert torch.equal(op[n].view(torch.int16), want.view(torch.int16)), (
            f"{n}: {(op[n] != want).sum().item()} of {want.numel()} differ")


def test_op_with_host_offsets_gives_the_same_bits():
    """``cu_seqlens_cpu`` (fla's argument) only saves the read-back: same outputs and gradients."""
    inputs, cfg = make_inputs(get_case("chunk64_varlen"))
    plain = run_op(inputs, cfg, "bf16")
    host = run_op(inputs, cfg, "bf16", cu_seqlens_cpu=inputs.cu_seqlens)
    assert sorted(plain) == sorted(host)
    for n, t in plain.items():
        assert t.isfinite().all() and torch.equal(t, host[n]), n
    with pytest.raises(ValueError, match="cu_seqlens_cpu: expected the shape of cu_seqlens"):
        run_op(inputs, cfg, "bf16", cu_seqlens_cpu=inputs.cu_seqlens[:-1])
    bad = r"cu_seqlens_cpu: expected non-decreasing offsets from 0 to T=150, found \[0, 70, 5, 150\]"
    with pytest.raises(ValueError, match=bad):
        run_op(inputs, cfg, "bf16", cu_seqlens_cpu=torch.tensor([0, 70, 5, 150]))


def test_op_refuses_a_parameter_or_state_on_another_device_than_q():
    """A_log, dt_bias and h0 on a device other than q's: one line naming the tensor and both devices, before any
    launch (Triton's own refusal names only a pointer's position). Meta tensors stand in for another device."""
    inputs, cfg = make_inputs(with_size(get_case("gate_softplus"), T=20))
    q, k, v, g, beta = (getattr(inputs.to(DEVICE), n) for n in ("q", "k", "v", "g", "beta"))
    H, K = q.shape[2], q.shape[3]
    A_log, dt_bias = torch.zeros(H, device=DEVICE), torch.zeros(H, K, device=DEVICE)
    h0 = torch.zeros(1, H, K, v.shape[-1], device=DEVICE)
    for name in ("A_log", "dt_bias", "h0"):
        kw = {"A_log": A_log, "dt_bias": dt_bias, "initial_state": h0}
        kw["initial_state" if name == "h0" else name] = kw["initial_state" if name == "h0" else name].to("meta")
        with pytest.raises(ValueError, match=rf"^{name}: expected device {q.device} \(q's\), found meta$"):
            chunk_kda(q, k, v, g, beta, use_gate_in_kernel=True, precision="fp32", **kw)


def test_op_without_final_state_and_lower_bound_without_params():
    inputs, cfg = make_inputs(with_size(get_case("basic"), T=20))
    q, k, v, g, beta = (getattr(inputs.to(DEVICE), n) for n in ("q", "k", "v", "g", "beta"))
    o, ht = chunk_kda(q, k, v, g, beta, use_gate_in_kernel=True, lower_bound=-3.0, precision="fp32")
    assert ht is None and o.shape == v.shape
    ref_inputs = type(inputs)(**{**dict(inputs.items()), "h0": None, "A_log": torch.zeros(2),
                                 "dt_bias": torch.zeros(2, 16)})
    ref = run_reference(ref_inputs, type(cfg)(scale=16 ** -0.5, gate="lower_bound", lower_bound=-3.0,
                                              qk_l2norm=False, beta_sigmoid=False), taps=())
    assert compare("o", o, ref.outputs["o"]).ratio < 1e-5


@pytest.mark.parametrize("name,precision", [("gva", "fp32"), ("gva_varlen", "bf16")])
def test_gva_runs_the_expanded_call(name, precision):
    """GVA: the kernels run q, k repeated per value head (``hv`` reads ``hv // group``): the same bits as
    the plain call on the repeated tensors, taps per value head, and dq, dk the float32 group sums."""
    inputs, cfg = make_inputs(get_case(name))
    B, T, H, K, V = inputs.shape
    G = inputs.group
    wide = type(inputs)(**{**dict(inputs.items()), "q": inputs.q.repeat_interleave(G, 2),
                           "k": inputs.k.repeat_interleave(G, 2)})
    sel = TapSelection(names=("S", "dS", "dki", "dgc"))
    gva, gva_taps, _ = run_fb(inputs, cfg, precision, sel)
    plain, plain_taps, _ = run_fb(wide, cfg, precision, sel)
    for n, t in plain.items():
        want = t.reshape(B, T, H, G, K).sum(3) if n in ("dq", "dk") else t
        assert gva[n].shape == want.shape and torch.equal(gva[n], want), n
    for n, t in plain_taps.items():
        assert gva_taps[n].shape[1] == inputs.HV and torch.equal(gva_taps[n].nan_to_num(7.0), t.nan_to_num(7.0)), n


def test_gva_op_takes_fla_flat_dt_bias():
    """chunk_kda with fla's GVA arguments: A_log [HV], dt_bias flat [HV*K]; ddt_bias comes back flat."""
    inputs, cfg = make_inputs(get_case("gva_varlen"))
    x = inputs.to(DEVICE)
    leaves = {n: getattr(x, n).clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")}
    A_log = x.A_log.clone().requires_grad_(True)
    dt_bias = x.dt_bias.reshape(-1).clone().requires_grad_(True)
    o, _ = chunk_kda(**leaves, scale=cfg.scale, cu_seqlens=x.cu_seqlens, use_qk_l2norm_in_kernel=True,
                     use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                     initial_state=x.h0, state_v_first=False, precision="fp32")
    (o * x.do).sum().backward()
    ref = run_reference(type(inputs)(**{**dict(inputs.items()), "dht": None}), cfg, taps=()).outputs
    assert dt_bias.grad.shape == (inputs.HV * inputs.q.shape[3],)
    for name, got in (("o", o), ("dq", leaves["q"].grad), ("dk", leaves["k"].grad), ("dA_log", A_log.grad),
                      ("ddt_bias", dt_bias.grad.reshape(inputs.dt_bias.shape))):
        assert compare(name, got, ref[name]).judge(TOLERANCES["fp32"][name]).passed, name


@pytest.mark.parametrize("name,precision", [("basic", "fp32"), ("chunk64_varlen", "bf16")])
def test_taps_do_not_change_outputs_or_gradients(name, precision):
    inputs, cfg = make_inputs(get_case(name))
    plain, *_ = run_fb(inputs, cfg, precision)
    tapped, buffers, _ = run_fb(inputs, cfg, precision, TapSelection())
    for n, t in plain.items():
        assert torch.equal(t.contiguous().view(torch.int32), tapped[n].contiguous().view(torch.int32)), n
    assert set(buffers) == set(TapSelection().names)


@gpu
def test_op_gpu_bf16_large():
    case = with_size(get_case("varlen"), K=128, V=128, H=4, chunk_size=64, dtype="bfloat16")
    inputs, cfg = make_inputs(case)
    inputs = inputs.to("cuda")
    check_all(run_op(inputs, cfg, "bf16"), run_reference(inputs, cfg, taps=(), device="cuda").outputs,
              TOLERANCES["bf16"])


@pytest.mark.parametrize("K, V, dtype", [
    pytest.param(256, 16, "float32", id="K256-V16"),
    pytest.param(16, 256, "float16", id="K16-V256-fp16"),
    pytest.param(200, 130, "bfloat16", id="K200-V130-bf16"),
])
def test_head_dims_up_to_256(K, V, dtype):
    """Head dims at the edges of the supported range, non-powers of two masked, every gradient and
    the state taps against the reference."""
    case = with_size(get_case("basic"), B=1, T=20, H=1, K=K, V=V, dtype=dtype)
    inputs, cfg = make_inputs(case)
    ref = run_reference(inputs, cfg, taps=("S", "dS", "dkd"))
    out, buffers, plan = run_fb(inputs, cfg, taps=TapSelection(names=("S", "dS", "dkd")))
    check_all({n: out[n] for n in ref.outputs}, ref.outputs, TOLERANCES["fp32"])
    for name in ("S", "dS", "dkd"):
        mask = None if name != "dkd" else (torch.arange(16)[None, None, :, None]
                                           < ref.chunks.length[:, None, None, None])
        c = compare(name, buffers[name], ref.taps[name], mask).judge(1e-5)
        assert c.passed, c


def test_state_passes_launch_the_longest_sequences_first(monkeypatch):
    """seq_order lists the sequences by chunk count, most first (ties in given order); the state passes
    read it along their grid's last axis. With that order or the given one (KDADBG_STATE_LONGEST_FIRST=0)
    o, ht and every gradient must match the reference: a program that took the wrong sequence's chunks
    or state would miss it."""
    from kdadbg_kernels.common import KernelChunks, state_grid

    cu = torch.tensor([0, 5, 205, 269, 399, 400])  # 1, 4, 1, 3 and 1 chunks of 64
    chunks = KernelChunks.build(1, 400, cu, 64, DEVICE)
    assert chunks.seq_order.cpu().tolist() == [1, 3, 0, 2, 4]
    assert state_grid(chunks, 3, 2) == (2, 3, 5)
    assert KernelChunks.build(3, 100, None, 64, DEVICE).seq_order.cpu().tolist() == [0, 1, 2]
    case = with_size(get_case("chunk64_varlen"), T=400, H=2, K=16, V=16, cu_seqlens=cu.tolist())
    inputs, cfg = make_inputs(case)
    ref = run_reference(inputs, cfg, taps=())
    got = {}
    for longest_first in ("1", "0"):
        monkeypatch.setenv("KDADBG_STATE_LONGEST_FIRST", longest_first)
        got[longest_first], *_ = run_fb(inputs, cfg, "fp32")
    assert set(got["1"]) == set(ref.outputs)
    for name, want in ref.outputs.items():
        # the two per-head sums (2 values each) are cancellation-prone here: dA_log is 1.2e-5 either way
        if name not in ("dA_log", "ddt_bias"):
            c = compare(name, got["1"][name].cpu(), want).judge(TOLERANCES["fp32"][name])
            assert c.passed, c
        assert torch.equal(got["1"][name], got["0"][name]), name  # each chain is one program either way


@pytest.mark.parametrize("B,T,C", [(1, 1, 16), (2, 17, 16), (3, 200, 64), (2, 64, 32), (1, 0, 16), (2, 130, 32)])
def test_dense_chunk_table_built_on_device_matches_spec_numbering(B, T, C):
    """The dense table is built with device arithmetic (no host copy); it must be spec §9's numbering."""
    from kdadbg_kernels.common import KernelChunks, chunk_layout

    got = KernelChunks.build(B, T, None, C, DEVICE)
    bos, lens, base, seq, t, start, length = chunk_layout(B, T, None, C)
    assert got.chunk_start.cpu().tolist() == start.tolist()
    assert got.chunk_len.cpu().tolist() == length.tolist()
    assert got.chunk_seq.cpu().tolist() == seq.tolist()
    assert got.seq_chunk_base.cpu().tolist() == base.tolist()
    assert (got.n_chunks, got.n_seqs) == (int(base[-1]), B)
    assert got.max_chunks == int((base[1:] - base[:-1]).max())
    assert all(x.dtype == torch.int32 for x in (got.chunk_start, got.chunk_len, got.chunk_seq, got.seq_chunk_base))
    # built once per (B, T, C, device): a second call launches nothing and returns the same table
    assert KernelChunks.build(B, T, None, C, DEVICE) is got
    assert KernelChunks.build(B, T + 1, None, C, DEVICE) is not got


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def forward_saved(inputs, cfg, precision):
    """What ``kda_forward`` keeps for the backward (``FwdSaved``) on ``inputs``, a training forward."""
    x = inputs.to(DEVICE)
    return kda_forward(x.q, x.k, x.v, x.g, x.beta, scale=cfg.scale, chunk_size=cfg.chunk_size, gate=cfg.gate,
                       lower_bound=cfg.lower_bound, qk_l2norm=cfg.qk_l2norm, beta_sigmoid=cfg.beta_sigmoid,
                       A_log=x.A_log, dt_bias=x.dt_bias, cu_seqlens=x.cu_seqlens, precision=precision)[2]


def knob_runs(inputs, cfg, precision, knob, values, monkeypatch, taps=None):
    """``run_fb`` with the taps of ``taps`` (default every tap) once per value of ``KDADBG_<knob>``:
    ``{value: (outputs, taps, plan)}``."""
    runs = {}
    for value in values:
        monkeypatch.setenv(f"KDADBG_{knob}", value)
        runs[value] = run_fb(inputs, cfg, precision, TapSelection() if taps is None else taps)
    return runs


def assert_same_bits(inputs, cfg, run_a, run_b):
    """Two ``run_fb`` results have the same bits in every output, gradient and tap (padding rows zeroed
    in both), with at least 7 outputs and 20 taps compared, each tap with finite values."""
    (out_a, taps_a, plan_a), (out_b, taps_b, _) = run_a, run_b
    assert plan_a is not None
    assert set(out_a) == set(out_b) and len(out_a) >= 7
    for n, t in out_b.items():
        assert torch.equal(bits(t), bits(out_a[n])), n
    B, T = inputs.q.shape[:2]
    lengths = chunk_layout(B, T, inputs.cu_seqlens, cfg.chunk_size)[6][plan_a.lo:plan_a.hi]
    assert list(taps_a) == list(taps_b) and len(taps_a) >= 20
    for n in taps_a:
        a, s = (zero_padding(n, x[n].cpu(), lengths) for x in (taps_a, taps_b))
        assert a.numel() and torch.isfinite(s).any(), n
        assert torch.equal(bits(a), bits(s)), n


def assert_same_selected_bits(inputs, cfg, run_a, run_b, names):
    """Two ``run_fb`` results over a tap selection: every output and gradient the same bits, and each tap of
    ``names`` too (padding rows zeroed in both), none NaN, shaped ``[hi-lo, n_sel, ...]`` by ``run_a``'s plan."""
    (out_a, taps_a, plan_a), (out_b, taps_b, _) = run_a, run_b
    assert set(out_a) == set(out_b) and out_a
    for n, t in out_b.items():
        assert torch.equal(bits(t), bits(out_a[n])), n
    B, T = inputs.q.shape[:2]
    lengths = chunk_layout(B, T, inputs.cu_seqlens, cfg.chunk_size)[6][plan_a.lo:plan_a.hi]
    assert list(taps_a) == list(taps_b) == list(names)
    for n in names:
        a, b = (zero_padding(n, x[n].cpu(), lengths) for x in (taps_a, taps_b))
        assert a.shape == b.shape and a.shape[:2] == (plan_a.hi - plan_a.lo, plan_a.n_sel), n
        assert not a.isnan().any(), n
        assert torch.equal(bits(a), bits(b)), n


@pytest.mark.parametrize("name,precision,window,heads", [
    pytest.param("varlen_short", "fp32", None, None, id="varlen_short-every_chunk_a_sequence_start"),
    pytest.param("no_state", "bf16", (0, 3), None, id="no_state-bf16-dS0_from_dh0_without_h0"),
    pytest.param("chunk32", "fp32", (1, 4), (1,), id="chunk32-window_past_chunk0-tail-one_head"),
    pytest.param("basic", "fp32", (0, 2), (1, 0), id="basic-full_chunks-heads_reversed"),
])
def test_aliased_taps_have_the_bits_of_the_stored_taps(name, precision, window, heads, monkeypatch):
    """The taps read from the kernels' own tensors (ALIAS_TAPS, knob TAPS_ALIAS=1) against the same taps
    stored by the kernels (TAPS_ALIAS=0): every valid element has the same bits, none is NaN, and
    outputs and gradients keep theirs. The cases take each way of reading: views (full chunks, a window
    past chunk 0), gathers (tail chunks, varlen), dS from dh0 at sequence starts, a head subset."""
    inputs, cfg = make_inputs(get_case(name))
    sel = TapSelection(chunks=window, heads=heads)
    runs = knob_runs(inputs, cfg, precision, "TAPS_ALIAS", ("1", "0"), monkeypatch, sel)
    plan_a, plan_s = runs["1"][2], runs["0"][2]
    # bf16 mode keeps Mqk, U, dU and S in bf16 (prepare.mqk_bf16, common.udu_bf16, common.s_bf16): their taps
    # have buffers of their own there
    own = ({"Mqk", "U", "dU"} | ({"S"} if s_bf16(precision) else set())) if precision == "bf16" else set()
    assert set(plan_a.aliased) == set(ALIAS_TAPS) - own and plan_s.aliased == ()
    assert not any(plan_a.has(n) for n in set(ALIAS_TAPS) - own) and all(plan_a.has(n) for n in own)
    assert_same_selected_bits(inputs, cfg, runs["1"], runs["0"], sel.names)


@pytest.mark.parametrize("name", ["chunk64_varlen", "gate_softplus", "bf16", "tail"])
def test_l2norm_as_row_scales_keeps_every_bit(name, monkeypatch):
    """fp32 mode with l2norm: the token kernel keeps the row scales ``rq, rk`` (knob QK_ROWSCALE=1, the
    default) and every later kernel forms ``qn = q * rq`` from the raw inputs (fp32 or, case ``bf16``,
    bf16): every output, gradient and tap has the bits of the run that stores ``qn, kn`` in fp32
    (QK_ROWSCALE=0), padding rows aside (zeroed in both)."""
    case = get_case(name)
    inputs, cfg = make_inputs(with_size(case, H=min(case.H, 2)))
    assert cfg.qk_l2norm, name
    runs = knob_runs(inputs, cfg, "fp32", "QK_ROWSCALE", ("1", "0"), monkeypatch)
    assert_same_bits(inputs, cfg, runs["1"], runs["0"])


@pytest.mark.parametrize("name", ["kimi_c64", "fla_layer_varlen", "tail", "chunk64_varlen"])
def test_backward_reading_the_forward_operands_keeps_every_bit(name, monkeypatch):
    """bf16 mode: the training forward keeps its ``qd`` for the backward's reverse state pass (knob
    BWD_FWD_OPERANDS=1, the default; the prep kernel then forms it no more): every output, gradient and
    tap has the bits of the run whose backward forms it again (=0), padding rows aside (zeroed in both).
    The forward keeps what the mask names: with 3 ``w`` too, with 0 neither."""
    case = get_case(name)
    inputs, cfg = make_inputs(with_size(case, H=min(case.H, 2)))
    kept = {}
    for mode in ("1", "0", "3"):
        monkeypatch.setenv("KDADBG_BWD_FWD_OPERANDS", mode)
        s = forward_saved(inputs, cfg, "bf16")
        kept[mode] = tuple(getattr(s, f) is not None for f in ("qd", "w"))
    assert kept == {"1": (True, False), "0": (False, False), "3": (True, True)}
    runs = knob_runs(inputs, cfg, "bf16", "BWD_FWD_OPERANDS", ("1", "0"), monkeypatch)
    assert_same_bits(inputs, cfg, runs["1"], runs["0"])


@pytest.mark.parametrize("name", ["basic", "chunk64_varlen", "kimi_varlen"])
def test_backward_reading_the_forward_w_within_bf16_tolerances(name, monkeypatch):
    """BWD_FWD_OPERANDS=3: the backward's reverse state pass reads the forward's ``w`` too (a tf32
    product, where the backward's own is a bf16 one): the op's outputs and gradients stay within bf16
    mode's tolerances of the float64 reference in these cases (on the H200 the bf16 case table's ``kimi``
    missed fla's bar in ``dA_log``, 1.14e-2 against 1e-2: why it is not the default)."""
    monkeypatch.setenv("KDADBG_BWD_FWD_OPERANDS", "3")
    inputs, cfg = make_inputs(get_case(name))
    check_all(run_op(inputs, cfg, "bf16"), run_reference(inputs, cfg, taps=()).outputs, TOLERANCES["bf16"])


def _two_heads(name):
    """Case ``name``'s inputs and config at two heads at most."""
    case = get_case(name)
    return make_inputs(with_size(case, H=min(case.H, 2)))


def _forward_args(inputs, cfg, precision):
    """``(x, kw)``: the inputs on the test device and ``kda_forward``'s keyword arguments for them (``h0`` in the
    math layout, ``o`` in v's dtype)."""
    x = inputs.to(DEVICE)
    h0 = None if x.h0 is None else (x.h0.transpose(-1, -2) if cfg.state_layout == "vk" else x.h0)
    return x, dict(scale=cfg.scale, chunk_size=cfg.chunk_size, gate=cfg.gate, lower_bound=cfg.lower_bound,
                   qk_l2norm=cfg.qk_l2norm, beta_sigmoid=cfg.beta_sigmoid, A_log=x.A_log, dt_bias=x.dt_bias,
                   cu_seqlens=x.cu_seqlens, precision=precision, out_dtype=x.v.dtype, h0=h0)


def _saved_dtypes(inputs, cfg, knob, field, monkeypatch):
    """The dtype of ``FwdSaved.<field>`` after a bf16 training forward with ``KDADBG_<knob>`` 1 and 0."""
    dtypes = {}
    for on in ("1", "0"):
        monkeypatch.setenv(f"KDADBG_{knob}", on)
        dtypes[on] = getattr(forward_saved(inputs, cfg, "bf16"), field).dtype
    return dtypes


@pytest.mark.parametrize("name", ["chunk64_varlen", "gate_softplus", "tail", "strong_gates"])
def test_mqk_in_bf16_keeps_every_bit(name, monkeypatch):
    """bf16 mode stores ``Mqk`` in bf16 (knob MQK_BF16=1, the default): each reader rounds it to bf16 for
    its MMA anyway, so every output, gradient and tap (the Mqk tap then stored from the intra kernel's
    fp32 registers, not read from the bf16 tensor) has the bits of the run that stores it in fp32
    (MQK_BF16=0), padding rows aside (zeroed in both)."""
    precision = "bf16"
    inputs, cfg = _two_heads(name)
    assert _saved_dtypes(inputs, cfg, "MQK_BF16", "Mqk", monkeypatch) == {"1": torch.bfloat16, "0": torch.float32}
    runs = knob_runs(inputs, cfg, precision, "MQK_BF16", ("1", "0"), monkeypatch)
    assert runs["1"][2].has("Mqk") and "Mqk" in runs["0"][2].aliased
    assert_same_bits(inputs, cfg, runs["1"], runs["0"])


@pytest.mark.parametrize("name,window,heads", [
    ("chunk64_varlen", None, None), ("tail", None, None), ("varlen_short", (1, 3), (1,)),
    ("strong_gates", (2, 4), (0,)),
])
def test_u_and_du_in_bf16_keep_every_bit(name, window, heads, monkeypatch):
    """bf16 mode stores ``U`` and the completed ``dU`` in bf16 (knob UDU_BF16=1, the default): their one
    reader, the backward V pass, rounds them to bf16 for its MMAs anyway, so every output, gradient and tap
    has the bits of the run that stores them in fp32 (UDU_BF16=0), padding rows aside (zeroed in both). The
    U and dU taps then have buffers of their own, stored by the state passes from their fp32 registers: every
    tap and every head, or a window past chunk 0 and one head (the state passes' tap condition)."""
    precision = "bf16"
    inputs, cfg = _two_heads(name)
    assert _saved_dtypes(inputs, cfg, "UDU_BF16", "U", monkeypatch) == {"1": torch.bfloat16, "0": torch.float32}
    if window is None:
        runs = knob_runs(inputs, cfg, precision, "UDU_BF16", ("1", "0"), monkeypatch)
        assert runs["1"][2].has("U") and runs["1"][2].has("dU")
        assert {"U", "dU"} <= set(runs["0"][2].aliased)
        assert_same_bits(inputs, cfg, runs["1"], runs["0"])
        return
    sel = TapSelection(names=("U", "dU", "S", "dS", "dvcorr"), chunks=window, heads=heads)
    runs = knob_runs(inputs, cfg, precision, "UDU_BF16", ("1", "0"), monkeypatch, sel)
    plan_a = runs["1"][2]
    assert plan_a.has("U") and plan_a.has("dU") and (plan_a.lo, plan_a.hi, plan_a.n_sel) == (*window, 1)
    assert_same_selected_bits(inputs, cfg, runs["1"], runs["0"], sel.names)


GATE_GRADIENTS = ("dg", "dA_log", "ddt_bias")


@pytest.mark.parametrize("name,window,heads", [
    ("chunk64_varlen", None, None), ("tail", None, None), ("gate_softplus", (1, 3), (1,)),
])
def test_s_in_bf16_moves_only_the_gate_gradients(name, window, heads, monkeypatch):
    """bf16 mode stores the per-chunk states ``S`` in bf16 (knob S_BF16=1, ``common.s_bf16``).
    The backward V pass reads them as bf16 MMA operands (the same bits as from fp32) and in ``dgTs =
    rowsum(dS⁺ ⊙ S)``, which sees the rounding: against S_BF16=0, every output, gradient and tap has the same
    bits (padding rows zeroed in both) except ``dg``, ``dA_log``, ``ddt_bias`` and the ``dgT`` tap, which
    differ (in these cases) by a relative RMS below 1e-2: a rounding of S (2^-9 relative) in one term of
    ``dgT``; an S stored wrong or not at all would move them by O(1). The S tap keeps its fp32 bits: the
    state pass stores it from its registers (every tap and head, or a window past chunk 0 and one head)."""
    precision = "bf16"
    inputs, cfg = _two_heads(name)
    assert _saved_dtypes(inputs, cfg, "S_BF16", "S", monkeypatch) == {"1": torch.bfloat16, "0": torch.float32}
    sel = None if window is None else TapSelection(names=("S", "U", "dS", "dgT", "dkr"), chunks=window,
                                                     heads=heads)
    runs = knob_runs(inputs, cfg, precision, "S_BF16", ("1", "0"), monkeypatch, sel)
    (out_a, taps_a, plan_a), (out_b, taps_b, plan_b) = runs["1"], runs["0"]
    assert plan_a.has("S") and "S" in plan_b.aliased
    if window is not None:
        assert (plan_a.lo, plan_a.hi, plan_a.n_sel) == (*window, 1)
    assert set(out_a) == set(out_b) and len(out_a) >= 7
    moved = []
    for n, t in out_b.items():
        if n in GATE_GRADIENTS:
            rel = float((out_a[n].double() - t.double()).norm() / t.double().norm())
            assert rel < 1e-2, (n, rel)
            if rel > 0:
                moved.append(n)
        else:
            assert torch.equal(bits(t), bits(out_a[n])), n
    assert moved == list(GATE_GRADIENTS), moved  # dgTs read the rounded S: the test saw the knob act
    B, T = inputs.q.shape[:2]
    lengths = chunk_layout(B, T, inputs.cu_seqlens, cfg.chunk_size)[6][plan_a.lo:plan_a.hi]
    assert list(taps_a) == list(taps_b) and "S" in taps_a and len(taps_a) >= (5 if window else 20)
    for n in taps_a:
        a, b = (zero_padding(n, x[n].cpu(), lengths) for x in (taps_a, taps_b))
        assert a.numel() and not a.isnan().any(), n
        if n == "dgT":
            rel = float((a.double() - b.double()).norm() / b.double().norm())
            assert 0 < rel < 1e-2, rel
        else:
            assert torch.equal(bits(a), bits(b)), n


@pytest.mark.parametrize("name", ["chunk64_varlen", "tail", "gate_softplus", "kimi_c64"])
def test_fused_wu_forms_u_in_the_state_pass(name, monkeypatch):
    """FWD_FUSE_WU=1 (bf16 mode, ``chunk.fuse_wu``): no w/u kernel; the token kernel stores ``kd`` in bf16
    and the state pass forms ``U = INV Diag(b) (v - kd S)``. Against the float64 reference o, ht and every
    gradient hold bf16 mode's bars. Against FWD_FUSE_WU=0 the taps formed before the state pass (token and
    intra kernels) keep their bits; ``U`` moves by roundings (relative RMS above 0, the knob acted, and below
    1e-2), and so does every later tap. With taps on, the outputs have the bits of the run with taps off;
    the inference forward (no backward to follow) has the training forward's o and ht, and so has the state
    pass loading INV with its pipeline's stages or a step ahead (REC_INV_AHEAD 0, 1). FWD_FUSE_WU=2 gives the
    inference forward those bits and the training forward (every output and gradient) FWD_FUSE_WU=0's. With
    the backward reading the forward's ``w`` (BWD_FWD_OPERANDS bit 2) the knob is refused in one line."""
    from kdadbg_kernels.taps import REGISTRY

    precision = "bf16"
    inputs, cfg = _two_heads(name)
    runs = knob_runs(inputs, cfg, precision, "FWD_FUSE_WU", ("1", "0"), monkeypatch)
    (out_a, taps_a, plan_a), (out_b, taps_b, _) = runs["1"], runs["0"]
    check_all({n: out_a[n].cpu() for n in out_a}, run_reference(inputs, cfg, taps=()).outputs, TOLERANCES["bf16"])
    monkeypatch.setenv("KDADBG_FWD_FUSE_WU", "1")
    plain, none, _ = run_fb(inputs, cfg, precision)
    assert set(plain) == set(out_a) and len(plain) >= 7 and none == {}
    for n, t in plain.items():
        assert torch.equal(bits(t), bits(out_a[n])), n
    B, T = inputs.q.shape[:2]
    lengths = chunk_layout(B, T, inputs.cu_seqlens, cfg.chunk_size)[6][plan_a.lo:plan_a.hi]
    assert list(taps_a) == list(taps_b) and len(taps_a) >= 20
    moved = []
    for n in taps_a:
        a, b = (zero_padding(n, x[n].cpu(), lengths) for x in (taps_a, taps_b))
        assert a.numel() and not a.isnan().any(), n
        if REGISTRY[n].stage == "fwd_prepare":
            assert torch.equal(bits(a), bits(b)), n
        else:
            fin = a.isfinite() & b.isfinite()  # ki-based taps may be inf by definition (strong gates)
            assert torch.equal(fin, a.isfinite() | b.isfinite()) and fin.any(), n
            a, b = a[fin].double(), b[fin].double()
            rel = float((a - b).norm() / b.norm().clamp_min(1e-300))
            assert rel < 1e-2, (n, rel)
            moved += [n] * (rel > 0)
    assert "U" in moved, moved
    x, kw = _forward_args(inputs, cfg, precision)
    o_t, ht_t, _, _ = kda_forward(x.q, x.k, x.v, x.g, x.beta, **kw)
    o_i, ht_i, saved, _ = kda_forward(x.q, x.k, x.v, x.g, x.beta, keep_state=False, **kw)
    assert saved.S is None and torch.equal(bits(o_t), bits(o_i)) and torch.equal(bits(ht_t), bits(ht_i))
    for ahead in ("0", "1"):  # INV loaded with the pipeline's stages or a step ahead: launch only
        monkeypatch.setenv("KDADBG_REC_INV_AHEAD", ahead)
        o_a, ht_a, _, _ = kda_forward(x.q, x.k, x.v, x.g, x.beta, **kw)
        assert torch.equal(bits(o_t), bits(o_a)) and torch.equal(bits(ht_t), bits(ht_a)), ahead
    monkeypatch.delenv("KDADBG_REC_INV_AHEAD")
    # FWD_FUSE_WU=2: the inference forward as with 1, the training forward (and its gradients) as with 0
    monkeypatch.setenv("KDADBG_FWD_FUSE_WU", "2")
    o_2, ht_2, _, _ = kda_forward(x.q, x.k, x.v, x.g, x.beta, keep_state=False, **kw)
    assert torch.equal(bits(o_2), bits(o_i)) and torch.equal(bits(ht_2), bits(ht_i))
    monkeypatch.setenv("KDADBG_FWD_FUSE_WU", "0")
    o_0, _, _, _ = kda_forward(x.q, x.k, x.v, x.g, x.beta, keep_state=False, **kw)
    assert not torch.equal(bits(o_0), bits(o_i))  # the knob moves o: the bits above say it acted
    monkeypatch.setenv("KDADBG_FWD_FUSE_WU", "2")
    train_2, _, _ = run_fb(inputs, cfg, precision)
    assert set(train_2) == set(out_b)
    for n, t in train_2.items():
        assert torch.equal(bits(t), bits(out_b[n])), n
    monkeypatch.setenv("KDADBG_FWD_FUSE_WU", "1")
    monkeypatch.setenv("KDADBG_BWD_FWD_OPERANDS", "3")
    with pytest.raises(ValueError, match="FWD_FUSE_WU=1 with KDADBG_BWD_FWD_OPERANDS bit 2"):
        run_fb(inputs, cfg, precision)


@pytest.mark.parametrize("name", ["chunk64_varlen", "tail", "gate_softplus", "kimi_c64", "gate_none"])
def test_inference_forms_gc_from_the_raw_gate(name, monkeypatch):
    """INFER_GC_FROM_G=1 (bf16 mode, ``prepare.infer_gc_from_g``): a forward with no backward to follow, with
    FWD_FUSE_WU, stores no ``gc`` (``FwdSaved.gc`` None: the knob acted) and its intra kernel forms ``gc``
    from the raw gate 16 rows at a time. ``INV`` and ``Mqk`` stay within 1e-4 (relative RMS) of the training
    forward's, whose ``gc`` the token kernel stored; o and the final state within 1e-2 of its, and within bf16
    mode's bars against the float64 reference. Where it does not apply (the training forward; without
    FWD_FUSE_WU, whose w/u kernel reads ``gc``) the knob changes no bit."""
    precision = "bf16"
    inputs, cfg = _two_heads(name)
    ref = run_reference(inputs, cfg, taps=()).outputs
    x, kw = _forward_args(inputs, cfg, precision)

    def forward(fuse, from_g, keep_state):
        monkeypatch.setenv("KDADBG_FWD_FUSE_WU", fuse)
        monkeypatch.setenv("KDADBG_INFER_GC_FROM_G", from_g)
        return kda_forward(x.q, x.k, x.v, x.g, x.beta, keep_state=keep_state, **kw)

    o_t, ht_t, s_t, _ = forward("1", "0", True)
    o_i, ht_i, s_i, _ = forward("1", "1", False)
    assert s_t.gc is not None and s_i.gc is None
    for a, b in ((s_i.INV, s_t.INV), (s_i.Mqk, s_t.Mqk)):
        assert a.numel() and a.isfinite().all()
        rel = float((a.double() - b.double()).norm() / b.double().norm())
        assert rel < 1e-4, rel
    for a, b in ((o_i, o_t), (ht_i, ht_t)):
        rel = float((a.double() - b.double()).norm() / b.double().norm())
        assert rel < 1e-2, rel
    ht = ht_i.transpose(-1, -2) if cfg.state_layout == "vk" else ht_i
    for n, t in (("o", o_i), ("ht", ht)):
        c = compare(n, t.cpu(), ref[n]).judge(TOLERANCES[precision][n])
        assert c.passed and c.count == t.numel(), (n, c.ratio, c.count)
    same = (forward("1", "0", False), forward("1", "1", True), forward("0", "1", False), forward("0", "0", False))
    for (o_a, ht_a, _, _), (o_b, ht_b, _, _) in ((same[0], same[1]), (same[2], same[3])):
        assert torch.equal(bits(o_a), bits(o_b)) and torch.equal(bits(ht_a), bits(ht_b))
    assert torch.equal(bits(same[1][0]), bits(o_t))


def test_tap_buffers_start_nan_in_two_flat_tensors():
    """alloc_tap_buffers_grouped: the taps outside ``group`` are views of one flat tensor NaN-filled at
    allocation (one fill), those in ``group`` views of another left for the caller to fill; no two views
    overlap, each starts on a 256-byte boundary and has its tap's shape."""
    from kdadbg_kernels.taps import REGISTRY, alloc_tap_buffers_grouped

    names = ("gc", "qd", "S", "U", "dkr", "dS", "dL")
    sel = TapSelection(names=names, chunks=(1, 4), heads=(0, 2))
    C, K, V = 16, 20, 24
    bufs, flat = alloc_tap_buffers_grouped(sel, 6, 3, C, K, V, "cpu", ("dkr", "dL"))
    assert list(bufs) == list(names) and flat is not None
    spans = {}
    for n, b in bufs.items():
        assert b.shape == (3, 2, *REGISTRY[n].dims(C, K, V)), n
        owner = flat if n in ("dkr", "dL") else bufs["gc"]
        assert b.untyped_storage().data_ptr() == owner.untyped_storage().data_ptr(), n
        assert (b.data_ptr() - owner.untyped_storage().data_ptr()) % 256 == 0, n
        spans[n] = (b.data_ptr(), b.data_ptr() + b.numel() * b.element_size())
        if n not in ("dkr", "dL"):
            assert b.isnan().all(), n
    ordered = sorted(spans.values())
    assert all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:]))
    bufs, flat = alloc_tap_buffers_grouped(sel, 6, 3, C, K, V, "cpu", ())
    assert flat is None and all(b.isnan().all() for b in bufs.values())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["chunk64_varlen", "tail"])
def test_u_loaded_ahead_keeps_every_bit(name, precision, monkeypatch):
    """The forward state pass with u loaded one step ahead into registers (knob REC_U_AHEAD=1, the bf16
    default at 16 columns) and without (=0): a launch choice, so every output, gradient and tap has the
    same bits, padding rows aside (zeroed in both)."""
    case = get_case(name)
    inputs, cfg = make_inputs(with_size(case, H=min(case.H, 2)))
    runs = knob_runs(inputs, cfg, precision, "REC_U_AHEAD", ("1", "0"), monkeypatch)
    assert_same_bits(inputs, cfg, runs["1"], runs["0"])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["chunk64_varlen", "tail", "gate_softplus", "kimi", "kimi_c64"])
def test_inference_forward_keeps_the_bits_and_not_the_state(name, precision, monkeypatch):
    """chunk_kda without a backward to follow (under torch.no_grad, or no input requiring grad) runs the
    forward with keep_state=False: o and the final state have the bits of the training forward; in bf16
    mode (the state pass forms o) the per-chunk S and U are then not stored, in fp32 mode (the output pass
    reads them) they are; with taps they always are. With l2norm bf16 mode's inference forward keeps row
    scales instead of qn, kn, each reader rounding q * rq to fp16 (bf16 with PREP_QK_LOWP=1) as the token
    kernel does (INFER_ROWSCALE, default 1; 0 stores qn, kn: the same bits either way), chunk 64 included
    (the training forward's token launch); the training forward stores them (its backward reads them)."""
    import kdadbg_kernels.chunk as chunk_mod

    case = get_case(name)
    inputs, cfg = make_inputs(with_size(case, H=min(case.H, 2)))
    x = inputs.to(DEVICE)
    kept, scales = [], []
    real = chunk_mod.kda_forward

    def spy(*a, **kw):
        out = real(*a, **kw)
        kept.append((kw.get("keep_state", True), out[2].S is not None, out[2].U is not None))
        scales.append(out[2].rq is not None)
        return out

    monkeypatch.setattr(chunk_mod, "kda_forward", spy)
    extra = {}
    if cfg.gate != "none":
        extra = dict(use_gate_in_kernel=True, A_log=x.A_log, dt_bias=x.dt_bias,
                     lower_bound=cfg.lower_bound if cfg.gate == "lower_bound" else None)

    def call(grad, taps=None):
        leaves = {n: getattr(x, n).clone().requires_grad_(grad) for n in ("q", "k", "v", "g", "beta")}
        return chunk_kda(**leaves, scale=cfg.scale, initial_state=x.h0, output_final_state=True,
                         cu_seqlens=x.cu_seqlens, chunk_size=cfg.chunk_size,
                         use_qk_l2norm_in_kernel=cfg.qk_l2norm, use_beta_sigmoid_in_kernel=cfg.beta_sigmoid,
                         state_v_first=cfg.state_layout == "vk", precision=precision, taps=taps, **extra)

    o_t, ht_t = call(True)
    with torch.no_grad():
        o_n, ht_n = call(True)
    o_d, ht_d = call(False)
    monkeypatch.setenv("KDADBG_INFER_ROWSCALE", "0")
    with torch.no_grad():
        o_q, ht_q = call(True)  # qn, kn stored, as in training
    monkeypatch.delenv("KDADBG_INFER_ROWSCALE")
    stored = precision == "fp32"
    assert kept == [(True, True, True)] + [(False, stored, stored)] * 3
    # row scales for q, k: fp32 mode always (QK_ROWSCALE), bf16 mode only without a backward
    # (prepare.rowscale_for_inference)
    assert cfg.qk_l2norm and scales == [stored, True, True, stored]
    for o, ht in ((o_n, ht_n), (o_d, ht_d), (o_q, ht_q)):
        assert not o.requires_grad and o.numel() and ht.numel()
        assert torch.equal(bits(o.float()), bits(o_t.detach().float()))
        assert torch.equal(bits(ht), bits(ht_t.detach()))
    kept.clear()
    scales.clear()
    with torch.no_grad():
        call(True, TapSelection(names=("S", "U"), chunks=(0, 1)))
    assert kept == [(False, True, True)] and scales == [stored]
    if precision == "bf16":  # bf16 qn, kn (PREP_QK_LOWP=1): the readers of the row scales round to bf16
        monkeypatch.setenv("KDADBG_PREP_QK_LOWP", "1")
        o_t, ht_t = call(True)
        with torch.no_grad():
            o_n, ht_n = call(True)
        assert scales[-2:] == [False, True]
        assert torch.equal(bits(o_n.float()), bits(o_t.detach().float())) and torch.equal(bits(ht_n), bits(ht_t.detach()))
        if cfg.chunk_size == 64:  # fp32 qn, kn (PREP_QK_LOWP=0): stored at chunk 64 (the product unrounded)
            monkeypatch.setenv("KDADBG_PREP_QK_LOWP", "0")
            scales.clear()
            with torch.no_grad():
                o_n, ht_n = call(True)
            assert scales == [False]


@pytest.mark.parametrize("B,T,cu,window", [
    pytest.param(1, 34, (0, 5, 25, 34), (2, 5), id="varlen-window_across_sequences"),
    pytest.param(1, 34, (0, 5, 25, 34), (2, 4), id="varlen-window_inside_a_sequence"),
    pytest.param(1, 40, None, (1, 4), id="dense-full_chunks"),
    pytest.param(2, 20, None, (0, 6), id="dense_B2-tails"),
])
def test_alias_nan_fills_the_window_and_reads_the_registry_layout(B, T, cu, window):
    """Host side of the aliased taps, on tensors that stand for the kernels': ``alias`` NaN-fills the tap
    window's part of each and nothing else; ``buffers`` then reads every tap row from the right token,
    chunk or (dS) the next chunk's dSn / the sequence's dh0, with padding rows 0, checked element by
    element against the spec's chunk numbering."""
    C, H, K, V = 8, 2, 3, 2
    cu_t = None if cu is None else torch.tensor(cu)
    _, _, base, seq, t, start, length = chunk_layout(B, T, cu_t, C)
    NC, N, BT = int(base[-1]), len(base) - 1, B * T
    chunks = KernelChunks.build(B, T, cu_t, C, "cpu")
    plan = TapPlan.build(TapSelection(names=("gc", "b", "S", "dS", "qd")), NC, H, C, K, V, "cpu")
    assert plan.aliased == ("gc", "b", "S", "dS") and plan.has("qd")
    lo, hi = window

    def register():
        p = TapPlan.build(TapSelection(names=plan.aliased, chunks=window), NC, H, C, K, V, "cpu")
        x = {"gc": torch.ones(BT, H, K), "b": torch.ones(BT, H), "S": torch.ones(NC, H, K, V),
             "dSn": torch.ones(NC, H, K, V), "dh0": torch.ones(N, H, K, V)}
        p.alias(chunks, gc=x["gc"], b=x["b"], S=x["S"], dS=(x["dSn"], x["dh0"], None))
        return p, x

    plan, x = register()
    t0, t1 = int(start[lo]), int(start[hi - 1] + length[hi - 1])
    for n, span in (("gc", (t0, t1)), ("b", (t0, t1)), ("S", (lo, hi)), ("dSn", (max(lo - 1, 0), hi - 1)),
                    ("dh0", (0, N))):
        inside = torch.zeros(x[n].shape[0], dtype=torch.bool)
        inside[span[0]:span[1]] = True
        assert x[n][inside].isnan().all() and not x[n][~inside].isnan().any(), n
    assert all(plan.buffers[n][i, :, :int(length[lo + i])].isnan().all() for n in ("gc", "b")
               for i in range(hi - lo))
    assert plan.buffers["S"].isnan().all() and plan.buffers["dS"].isnan().all()

    plan, x = register()
    for n, v in x.items():  # what the kernels would write: every element distinct
        v.copy_(torch.arange(v.numel(), dtype=torch.float32).view(v.shape) + 1000 * len(n))
    buf = plan.buffers
    for i, c in enumerate(range(lo, hi)):
        for h in range(H):
            assert torch.equal(buf["S"][i, h], x["S"][c, h])
            dS = x["dh0"][int(seq[c]), h] if int(t[c]) == 0 else x["dSn"][c - 1, h]
            assert torch.equal(buf["dS"][i, h], dS), (c, h)
            for r in range(C):
                want_gc = x["gc"][int(start[c]) + r, h] if r < int(length[c]) else torch.zeros(K)
                want_b = x["b"][int(start[c]) + r, h] if r < int(length[c]) else torch.tensor(0.)
                assert torch.equal(buf["gc"][i, h, r], want_gc), (c, h, r)
                assert torch.equal(buf["b"][i, h, r], want_b), (c, h, r)




@pytest.mark.parametrize("name,precision", [("kimi_varlen", "bf16"), ("t63", "fp32")])
def test_finish_kernel_one_pass_and_two_passes_agree(name, precision, monkeypatch):
    """The backward finish kernel's l2norm backward over all of K at once (the default up to K = 128, each
    row read once) against K blocks of 16 read twice (``FINISH_BK=16``): dq and dk within a few fp32
    roundings (the row sums add in another order), every other output and gradient the same bits."""
    case = get_case(name)
    inputs, cfg = make_inputs(with_size(case, H=min(case.H, 2), K=48))
    assert cfg.qk_l2norm
    runs = {}
    for bk in ("", "16"):
        monkeypatch.setenv("KDADBG_FINISH_BK", bk) if bk else monkeypatch.delenv("KDADBG_FINISH_BK", raising=False)
        runs[bk] = run_fb(inputs, cfg, precision)[0]
    one, two = runs[""], runs["16"]
    assert set(one) == set(two) and {"dq", "dk"} < set(one) and len(one) >= 7
    for n in one:
        if n in ("dq", "dk"):
            a, b = one[n].float(), two[n].float()
            assert a.abs().max() > 0 and torch.allclose(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max())), n
        else:
            assert torch.equal(bits(one[n]), bits(two[n])), n


@pytest.mark.parametrize("name,precision,size", [("kimi_varlen", "bf16", dict(K=48)), ("t63", "fp32", dict(H=2))])
def test_heads_first_launch_keeps_every_bit(name, precision, size, monkeypatch):
    """The kernels parallel over chunks and heads on one axis of programs, a chunk's heads (and K or V blocks)
    adjacent (``HEADS_FIRST``, the default; the K pass with ``DQKG_HEADS_FIRST=1``), against their
    ``(chunks, heads)`` grids: every output, gradient and tap the same bits, over a tap window that splits the
    launches (the window's launch starts at chunk 2), so each program finds the chunk, head and block it
    stands for. On the CPU too: a program computes the same products wherever it sits in the grid. The
    varlen case at K = 48 gives the V and K passes two K blocks; ``t63`` in fp32 mode runs the output pass."""
    inputs, cfg = make_inputs(with_size(get_case(name), **size))
    assert inputs.q.shape[2] >= 2
    sel = TapSelection(chunks=(2, 4))
    base = run_fb(inputs, cfg, precision, sel)
    for knob_name, value in (("HEADS_FIRST", "0"), ("DQKG_HEADS_FIRST", "1")):
        with monkeypatch.context() as mp:
            mp.setenv(f"KDADBG_{knob_name}", value)
            assert_same_bits(inputs, cfg, base, run_fb(inputs, cfg, precision, sel))


@gpu
@pytest.mark.parametrize("name,precision", [("kimi_c64", "bf16"), ("chunk64_varlen", "bf16"), ("t63", "fp32")])
def test_launch_only_knobs_of_the_prepare_kernels_keep_every_bit(name, precision, monkeypatch):
    """Launch-only knobs of the forward token, intra and w/u kernels (pipeline stages), of the backward
    precompute (warps, stages, K and V blocks of products over the chunk's rows alone), of the backward
    state pass and the finish kernel (stages), the launch order (``HEADS_FIRST``, ``DQKG_HEADS_FIRST``),
    each against the default:
    every output, gradient and tap has the same bits. GPU only: the interpreter ignores warps and stages,
    and NumPy's BLAS rounds a product differently with its width (``kernels/tuning.py``)."""
    inputs, cfg = make_inputs(get_case(name))
    sel = TapSelection(chunks=(0, 3))
    base = run_fb(inputs, cfg, precision, sel)
    for knob_name, value in (("PREP_STAGES", "1"), ("PREP_SOLVE_STAGES", "1"), ("PREP_SOLVE_STAGES", "3"),
                             ("PREP_SOLVE_STAGES", "4"), ("BPREP_WARPS", "8"), ("BPREP_BK", "32"), ("BPREP_BV", "32"),
                             ("PREP_WU_STAGES", "1"), ("PREP_WU_STAGES", "2"), ("BPREP_STAGES", "1"),
                             ("BPREP_STAGES", "2"), ("FINISH_STAGES", "1"), ("RECB_STAGES", "3"),
                             ("RECB_STAGES", "1"), ("PREP_AHEAD", "1"), ("PREP_UNROLL", "8"),
                             ("DQKG_PREFETCH", "0"), ("HEADS_FIRST", "0"), ("DQKG_HEADS_FIRST", "1")):
        with monkeypatch.context() as mp:
            mp.setenv(f"KDADBG_{knob_name}", value)
            assert_same_bits(inputs, cfg, base, run_fb(inputs, cfg, precision, sel))


CPU_CALL = """\
import os, sys
import torch
{before}
import kdadbg_kernels
from kdadbg_kernels.chunk import kda_forward_backward

q, k, v, g = (torch.randn(1, 16, 1, 16) for _ in range(4))
beta, do = torch.rand(1, 16, 1), torch.randn(1, 16, 1, 16)
for call in (lambda: kdadbg_kernels.chunk_kda(q, k, v, g, beta), lambda: kda_forward_backward(q, k, v, g, beta, do, scale=0.25)):
    try:
        call()
    except RuntimeError as e:
        print(type(e).__name__, "|", e)
"""


@pytest.mark.parametrize("before, why", [
    pytest.param("", "Triton was imported without TRITON_INTERPRET=1", id="compiled"),
    pytest.param("import triton\nos.environ['TRITON_INTERPRET'] = '1'", "triton was imported before TRITON_INTERPRET=1",
                 id="interpreter-set-after-triton"),
])
def test_op_on_cpu_without_the_interpreter_says_what_to_do(before, why):
    """CPU tensors where Triton's interpreter is not on: one line naming the device and the fix, from the op and
    from kda_forward_backward, in place of Triton's '0 active drivers' or InterpreterError at the first launch."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", CPU_CALL.format(before=before)], capture_output=True, text=True,
                       env=env, timeout=300)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 2, (r.stdout, r.stderr)
    for line in lines:
        assert line.startswith("DeviceError | kdadbg_kernels: q is on device cpu, but " + why), line
        assert "set TRITON_INTERPRET=1 before importing triton or kdadbg_kernels" in line and "CUDA tensors" in line
