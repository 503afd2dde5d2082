"""Every kernel's loads and stores stay inside the tensors it is given (``tests/bounds.py``: under the Triton
interpreter, each address a load or store touches is checked against the launch's tensor arguments), over a
forward + backward with every tap on: sequence starts and short sequences, one-row tails, h0 and dht, both
precisions, the three gate settings, GVA, and the state passes' V blocks of 16 and 32 (the GPU's launches
for many heads or sequences); and the inference forward."""

from __future__ import annotations

import pytest
import torch

from bounds import bounds_checked
from conftest import HAS_GPU
from kdadbg.cases import get_case, make_inputs, with_size
from kdadbg_kernels import TapSelection

pytestmark = pytest.mark.skipif(HAS_GPU, reason="the bounds check runs under the Triton interpreter (CPU)")


def test_the_check_catches_an_address_one_past_a_tensor():
    import triton
    import triton.language as tl

    @triton.jit
    def copy16(x, y, shift):
        o = tl.arange(0, 16)
        tl.store(y + o, tl.load(x + o + shift, mask=o < 16))

    x, y = torch.arange(16.), torch.zeros(16)
    with bounds_checked() as n:
        copy16[(1,)](x, y, 0)
    assert torch.equal(y, x) and (n.launches, n.addresses) == (1, 32)  # 16 loads, 16 stores
    with pytest.raises(Exception, match=r"copy16: a load touched 1 address\(es\) outside its tensor arguments"):
        with bounds_checked():
            copy16[(1,)](x, y, 1)


# (case, K, V, precision, V block of both state passes)
RUNS = [
    ("chunk64_varlen", 32, 64, "bf16", 32),
    ("chunk64_varlen", 32, 64, "fp32", 16),
    ("varlen_short", 16, 32, "bf16", 32),
    ("varlen_short", 16, 32, "fp32", 32),
    ("tail", 16, 32, "bf16", 16),
    ("fla_layer_varlen", 32, 64, "bf16", 32),  # softplus, chunk 64, no h0 or dht
    ("strong_gates_none", 16, 32, "bf16", 32),  # pre-gated
    ("gva_varlen", 16, 32, "bf16", 32),
]


@pytest.mark.parametrize("name,K,V,precision,bv", RUNS)
def test_every_kernel_stays_inside_its_tensors(name, K, V, precision, bv, monkeypatch):
    from test_kernels import run_fb

    case = get_case(name)
    inputs, cfg = make_inputs(with_size(case, H=min(case.H, 2), K=K, V=V))
    monkeypatch.setenv("KDADBG_REC_BV", str(bv))
    monkeypatch.setenv("KDADBG_RECB_BV", str(bv))
    with bounds_checked() as n:
        outputs, taps, _ = run_fb(inputs, cfg, precision, TapSelection())
    assert {"chunk_bwd_dqkg_kernel", "recurrence_bwd_kernel", "kda_fwd_recurrence_kernel"} <= n.kernels
    assert n.launches >= 9 and n.addresses > 10 * inputs.q.numel()
    assert all(torch.isfinite(x).all() for x in outputs.values() if x is not None)


@pytest.mark.parametrize("name,precision,knobs", [
    ("chunk64_varlen", "bf16", {}), ("varlen_short", "fp32", {}),
    # the state pass forming U, the intra kernel forming gc from the raw gate (prepare.infer_gc_from_g)
    ("chunk64_varlen", "bf16", {"FWD_FUSE_WU": "1", "INFER_GC_FROM_G": "1"}),
])
def test_the_inference_forward_stays_inside_its_tensors(name, precision, knobs, monkeypatch):
    """``chunk_kda`` under ``torch.no_grad`` (the inference forward: no state kept for a backward)."""
    from kdadbg_kernels import chunk_kda

    case = get_case(name)
    inputs, cfg = make_inputs(with_size(case, H=min(case.H, 2), K=32, V=64))
    monkeypatch.setenv("KDADBG_REC_BV", "32")
    for knob, value in knobs.items():
        monkeypatch.setenv(f"KDADBG_{knob}", value)
    with bounds_checked() as n, torch.no_grad():
        o, ht = chunk_kda(inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta, scale=cfg.scale,
                          initial_state=inputs.h0, output_final_state=True, cu_seqlens=inputs.cu_seqlens,
                          chunk_size=cfg.chunk_size, use_qk_l2norm_in_kernel=cfg.qk_l2norm,
                          use_beta_sigmoid_in_kernel=cfg.beta_sigmoid, state_v_first=cfg.state_layout == "vk",
                          precision=precision, use_gate_in_kernel=True, A_log=inputs.A_log,
                          dt_bias=inputs.dt_bias, lower_bound=cfg.lower_bound)
    assert {"kda_fwd_recurrence_kernel", "kda_fwd_intra_solve_kernel"} <= n.kernels
    assert ("kda_fwd_wu_kernel" in n.kernels) == (not knobs) and n.addresses > 3 * inputs.q.numel()
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
