"""The test-only pure-torch implementation (``tests/impls/torch_kda.py``): the clean function
against the float64 oracle, and each planted fault landing exactly where its docstring says."""

import importlib.util
import pathlib
from dataclasses import replace

import pytest
import torch

from kdadbg.cases import get_case, make_inputs
from kdadbg.oracle import run_oracle

_PATH = pathlib.Path(__file__).resolve().parent / "impls" / "torch_kda.py"
_spec = importlib.util.spec_from_file_location("torch_kda_impl", _PATH)  # as the tool loads it
impl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(impl)

SMALL = dict(H=2, K=8, V=8)


def small_case(name, **kw):
    c = get_case(name)
    return replace(c, **{**SMALL, **({"T": min(c.T, 70)} if c.cu_seqlens is None else {}), **kw})


def call_args(inputs, cfg):
    """fla keyword arguments for a dump's config."""
    gated = cfg.gate != "none"
    return dict(scale=cfg.scale, initial_state=inputs.h0, output_final_state=True,
                cu_seqlens=inputs.cu_seqlens, chunk_size=cfg.chunk_size,
                use_qk_l2norm_in_kernel=cfg.qk_l2norm, use_gate_in_kernel=gated,
                use_beta_sigmoid_in_kernel=cfg.beta_sigmoid,
                lower_bound=cfg.lower_bound if cfg.gate == "lower_bound" else None,
                A_log=inputs.A_log if gated else None, dt_bias=inputs.dt_bias if gated else None,
                state_v_first=cfg.state_layout == "vk")


def run(fn, inputs, cfg, **over):
    """Outputs and autograd gradients the way the tool takes them."""
    names = [n for n in ("q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias")
             if getattr(inputs, n) is not None and (cfg.gate != "none" or n not in ("A_log", "dt_bias"))]
    leaf = {n: getattr(inputs, n).detach().clone().requires_grad_(True) for n in names}
    kw = call_args(inputs, cfg)
    kw.update({"initial_state": leaf.get("h0"), "A_log": leaf.get("A_log"),
               "dt_bias": leaf.get("dt_bias"), **over})
    o, ht = fn(leaf["q"], leaf["k"], leaf["v"], leaf["g"], leaf["beta"], **kw)
    dht = inputs.dht if inputs.dht is not None else torch.zeros_like(ht)
    grads = torch.autograd.grad((o, ht), list(leaf.values()), (inputs.do, dht), allow_unused=True)
    out = {"o": o.detach(), "ht": ht.detach()}
    for n, gr in zip(names, grads):
        out["d" + n] = torch.zeros_like(leaf[n]) if gr is None else gr
    return out


@pytest.mark.parametrize("name", [pytest.param(n, id=n) for n in (
    "basic", "gate_none", "gate_softplus", "varlen_short", "kv_layout", "raw", "no_state", "varlen_kv")])
def test_clean_matches_oracle(name):
    inputs, cfg = make_inputs(small_case(name), seed=2)
    inputs = inputs.to(dtype=torch.float64)
    got, want = run(impl.chunk_kda, inputs, cfg), run_oracle(inputs, cfg)
    assert set(want) <= set(got)
    for key, w in want.items():
        torch.testing.assert_close(got[key], w, rtol=1e-10, atol=1e-10, msg=key)


def test_flat_dt_bias_and_dtypes():
    inputs, cfg = make_inputs(small_case("basic", T=20), seed=2)
    kw = call_args(inputs, cfg)
    o, ht = impl.chunk_kda(inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta, **kw)
    o2, _ = impl.chunk_kda(inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta,
                           **{**kw, "dt_bias": inputs.dt_bias.flatten()})
    assert o.dtype == ht.dtype == torch.float32 and torch.equal(o, o2)
    bf = inputs.to(dtype=torch.bfloat16)
    ob, hb = impl.chunk_kda(bf.q, bf.k, bf.v, bf.g, bf.beta, **{**kw, "initial_state": bf.h0})
    assert ob.dtype == torch.bfloat16 and hb.dtype == torch.float32
    assert impl.chunk_kda(inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta,
                          **{**kw, "output_final_state": False})[1] is None


def test_plant_mark():
    beta = torch.zeros(2, 5, 3)
    a, b = impl.plant_mark(beta, 7, 1), impl.plant_mark(beta, (1, 2), 1)
    assert torch.equal(a, b) and a[1, 2, 1] == impl.MARK and (a != 0).sum() == 1 and not beta.any()


# Faults: B=2, T=64, chunk 16; the mark sits at token 20 (chunk 1) of row 0, head 1. Gates near 0
# (no decay), so a perturbed state stays visible to the last token instead of decaying away.
FAULT_CASE = dict(B=2, T=64, chunk_size=16, gates="zero")


@pytest.fixture(scope="module")
def marked():
    inputs, cfg = make_inputs(small_case("basic", **FAULT_CASE), seed=4)
    inputs = inputs.to(dtype=torch.float64)
    inputs.beta = impl.plant_mark(inputs.beta, (0, 20), 1)
    return inputs, cfg, run(impl.chunk_kda, inputs, cfg)


def where_diff(a, b):
    """The (row, token, head) cells where two ``[B,T,H,D]`` tensors differ."""
    return (a != b).any(-1)


def cells(tokens, B=2, T=64, H=2, row=0, head=1):
    m = torch.zeros(B, T, H, dtype=torch.bool)
    m[row, tokens, head] = True
    return m


def test_fwd_fault(marked):
    inputs, cfg, clean = marked
    bad = run(impl.fwd_fault, inputs, cfg)
    assert torch.equal(where_diff(bad["o"], clean["o"]), cells(slice(16, 32)))
    torch.testing.assert_close(bad["o"][0, 16:32, 1], 1.01 * clean["o"][0, 16:32, 1], rtol=1e-14, atol=0)
    for key in clean:
        if key != "o":
            assert torch.equal(bad[key], clean[key]), key


def test_bwd_fault(marked):
    inputs, cfg, clean = marked
    bad = run(impl.bwd_fault, inputs, cfg)
    assert torch.equal(where_diff(bad["dk"], clean["dk"]), cells(slice(16, 32)))
    torch.testing.assert_close(bad["dk"][0, 16:32, 1], 1.01 * clean["dk"][0, 16:32, 1], rtol=1e-14, atol=0)
    for key in clean:
        if key != "dk":
            assert torch.equal(bad[key], clean[key]), key


def test_state_fault(marked):
    inputs, cfg, clean = marked
    bad = run(impl.state_fault, inputs, cfg)
    assert torch.equal(where_diff(bad["o"], clean["o"]), cells(slice(32, 64)))
    assert torch.equal(where_diff(bad["ht"], clean["ht"]).any(-1),
                       torch.tensor([[False, True], [False, False]]))


def test_state_fault_in_the_last_chunk():
    inputs, cfg = make_inputs(small_case("basic", **FAULT_CASE), seed=4)
    inputs = inputs.to(dtype=torch.float64)
    inputs.beta = impl.plant_mark(inputs.beta, (1, 63), 0)
    clean, bad = run(impl.chunk_kda, inputs, cfg), run(impl.state_fault, inputs, cfg)
    assert torch.equal(bad["o"], clean["o"])
    torch.testing.assert_close(bad["ht"][1, 0], 1.01 * clean["ht"][1, 0], rtol=1e-14, atol=0)
    assert torch.equal(bad["ht"][0], clean["ht"][0]) and torch.equal(bad["ht"][1, 1], clean["ht"][1, 1])


@pytest.mark.parametrize("fault,key", [pytest.param("fwd_fault", "o", id="fwd"),
                                       pytest.param("bwd_fault", "dk", id="bwd"),
                                       pytest.param("state_fault", "o", id="state")])
def test_marked_faults_follow_their_data(fault, key):
    """Rerun on a window: chunks 1..3 of row 0, from the clean state entering chunk 1."""
    inputs, cfg = make_inputs(small_case("basic", **FAULT_CASE), seed=4)
    inputs = inputs.to(dtype=torch.float64)
    inputs.beta = impl.plant_mark(inputs.beta, (0, 20), 1)
    def part(tokens, **states):
        return type(inputs)(**{**{n: t[:1, tokens] for n, t in inputs.items()
                                  if t.dim() >= 3 and n not in ("h0", "dht")},
                               "A_log": inputs.A_log, "dt_bias": inputs.dt_bias, **states})

    lead = run(impl.chunk_kda, part(slice(0, 16), h0=inputs.h0[:1]), cfg)
    win = part(slice(16, None), h0=lead["ht"], dht=inputs.dht[:1])
    full = run(impl.chunk_kda, inputs, cfg)
    clean, bad = run(impl.chunk_kda, win, cfg), run(getattr(impl, fault), win, cfg)
    want = {"fwd_fault": slice(0, 16), "bwd_fault": slice(0, 16), "state_fault": slice(16, 48)}[fault]
    torch.testing.assert_close(clean["o"], full["o"][:1, 16:], rtol=1e-12, atol=1e-12)
    assert torch.equal(where_diff(bad[key], clean[key]), cells(want, B=1, T=48))


def test_varlen_fault():
    inputs, cfg = make_inputs(small_case("varlen_short"), seed=4)   # cu_seqlens [0, 1, 17, 33]
    inputs = inputs.to(dtype=torch.float64)
    clean, bad = run(impl.chunk_kda, inputs, cfg), run(impl.varlen_fault, inputs, cfg)
    rows = where_diff(bad["o"], clean["o"])[0].any(-1)
    assert torch.equal(rows, torch.arange(33).ge(1) & torch.arange(33).lt(17))
    assert not bad["o"][0, 1].any()
    assert torch.equal(where_diff(bad["ht"], clean["ht"]).any(-1).any(-1), torch.tensor([False, True, False]))
    batched, _ = make_inputs(small_case("basic", T=20), seed=4)
    kw = call_args(batched, cfg)
    a = impl.varlen_fault(batched.q, batched.k, batched.v, batched.g, batched.beta, **kw)
    b = impl.chunk_kda(batched.q, batched.k, batched.v, batched.g, batched.beta, **kw)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_forward_only():
    inputs, cfg = make_inputs(small_case("basic", T=20), seed=4)
    leaf = {n: getattr(inputs, n).clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")}
    kw = call_args(inputs, cfg)
    o, ht = impl.forward_only(*leaf.values(), **kw)
    o2, ht2 = impl.chunk_kda(*leaf.values(), **kw)
    assert o.grad_fn is None and ht.grad_fn is None and o2.grad_fn is not None
    assert torch.equal(o, o2.detach()) and torch.equal(ht, ht2.detach())
    with pytest.raises(RuntimeError):
        torch.autograd.grad(o, list(leaf.values()), torch.ones_like(o))
