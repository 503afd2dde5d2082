"""The case table covers the regimes that found real bugs, and the shipped samples are what
``sample_inputs/make_samples.sh`` says."""

import shlex

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from conftest import REPO
from kdadbg import cli
from kdadbg.cases import CASES
from kdadbg.dump import load_dump

SAMPLES = REPO / "sample_inputs"


def _has_short_sequence(c):
    cu = c.cu_seqlens
    return cu is not None and any(b - a < c.chunk_size for a, b in zip(cu, cu[1:]))


REGIMES = {
    "tail chunk": lambda c: c.T % c.chunk_size != 0 and c.cu_seqlens is None,
    "varlen, a sequence shorter than a chunk": _has_short_sequence,
    "gates at the lower bound": lambda c: c.gates == "lower" and c.gate == "lower_bound",
    "zero gates": lambda c: c.gates == "zero",
    "beta near 0": lambda c: c.betas == "low",
    "beta near 1": lambda c: c.betas == "high",
    "non-zero h0 and dht": lambda c: c.h0 and c.dht,
    "kv layout": lambda c: c.state_layout == "kv",
    "K != V": lambda c: c.K != c.V,
    "head dims under 16": lambda c: c.K < 16 and c.V < 16,
    "gate none": lambda c: c.gate == "none",
    "gate lower_bound": lambda c: c.gate == "lower_bound",
    "gate softplus": lambda c: c.gate == "softplus",
    "chunk 32": lambda c: c.chunk_size == 32,
    "chunk 64": lambda c: c.chunk_size == 64,
    "bf16 inputs": lambda c: c.dtype == "bfloat16",
    "a model's gates (fla layer init), softplus": lambda c: c.gates == "layer" and c.gate == "softplus",
    "a model's gates (fla layer init), lower bound": lambda c: c.gates == "layer" and c.gate == "lower_bound",
    "a model's gates, varlen": lambda c: c.gates == "layer" and _has_short_sequence(c),
    "grouped value heads (GVA)": lambda c: c.n_value_heads > c.H,
    "GVA with varlen, a sequence shorter than a chunk": lambda c: c.n_value_heads > c.H and _has_short_sequence(c),
}


@pytest.mark.parametrize("regime", list(REGIMES))
def test_case_table_covers(regime):
    assert [c.name for c in CASES if REGIMES[regime](c)], f"no case for: {regime}"


def test_fla_layer_gates_are_strong():
    """fla's layer statistics drive the within-chunk cumulative gate to about -100 (exp(-gc) ~ e^100)."""
    from kdadbg.cases import get_case, make_inputs
    from kdadbg.reference import run_reference

    inputs, cfg = make_inputs(get_case("fla_layer"))
    gc = run_reference(inputs, cfg, taps=("gc",)).taps["gc"]
    assert -130 < float(gc.min()) < -80


def test_gva_cases_shapes():
    """GVA cases: q, k over H heads, everything else over HV value heads."""
    from kdadbg.cases import get_case, make_inputs

    for name in ("gva", "gva_varlen"):
        c = get_case(name)
        inputs, _ = make_inputs(c)
        assert inputs.q.shape[2] == inputs.k.shape[2] == c.H and inputs.HV == c.HV > c.H
        assert inputs.g.shape[2] == inputs.beta.shape[2] == inputs.do.shape[2] == c.HV
        assert inputs.A_log.shape == (c.HV,) and inputs.dt_bias.shape == (c.HV, c.K)
        assert inputs.h0.shape[1] == inputs.dht.shape[1] == c.HV


def test_case_names_unique():
    assert len({c.name for c in CASES}) == len(CASES)


def _gen_lines():
    lines = [shlex.split(line) for line in (SAMPLES / "make_samples.sh").read_text().splitlines()
             if line.startswith("kdadbg gen ")]
    assert len(lines) >= 4
    return lines


@pytest.mark.parametrize("argv", _gen_lines(), ids=lambda a: a[2])
def test_shipped_samples_match_make_samples(tmp_path, argv):
    shipped = REPO / argv[2]
    out = tmp_path / shipped.name
    r = CliRunner().invoke(cli.app, [argv[1], str(out), *argv[3:]])
    assert r.exit_code == 0, r.output
    with safe_open(str(shipped), "pt") as a, safe_open(str(out), "pt") as b:
        assert a.metadata() == b.metadata() and sorted(a.keys()) == sorted(b.keys())
        for key in a.keys():
            assert torch.equal(a.get_tensor(key), b.get_tensor(key)), key
    load_dump(shipped)


def test_samples_small():
    assert sum(p.stat().st_size for p in SAMPLES.glob("*.safetensors")) < 5 * 2 ** 20
    inputs, _ = load_dump(SAMPLES / "basic.safetensors")
    assert inputs.shape == (1, 256, 2, 64, 64)
