"""Large cases on the GPU (skipped without CUDA): the kernels against the float64 reference at
training sizes, both precisions, taps on/off bit equality, and run-to-run determinism.

One call on the GPU machine runs these with the rest of the suite: ``bash benchmarks/gpu_check.sh``.
"""

import dataclasses

import pytest
import torch

from conftest import gpu
from kdadbg.impls.ours import run_kernels
from kdadbg.cases import Case, make_inputs
from kdadbg.compare import compare
from kdadbg.reference import run_reference
from kdadbg.tapsfile import outputs_that_apply
from kdadbg.tolerances import TOLERANCES
from kdadbg_kernels.taps import REGISTRY, TAP_NAMES, TapSelection

pytestmark = gpu

# ki = kn exp(-gc), and dqd, dkd (which multiply by ki), reach exp(64 * 5) over 32/64 rows:
# past float32's range by definition, so float32 taps of them cannot match there.
OVERFLOWING = ("ki", "dqd", "dkd")
MIXED6 = (2600, 1094, 4096, 1926, 542, 6126)  # 16384 tokens, the peer benchmark's varlen batch

BIG = {
    "dense_T16384_H16": Case("dense_T16384_H16", T=16384, H=16, K=128, V=128),
    "varlen_mixed6_H16": Case("varlen_mixed6_H16", T=16384, H=16, K=128, V=128,
                              cu_seqlens=tuple(sum(MIXED6[:i]) for i in range(len(MIXED6) + 1))),
    "chunk64_T8192_H16_kv": Case("chunk64_T8192_H16_kv", T=8192, H=16, K=128, V=128, chunk_size=64,
                                 state_layout="kv"),
    "strong_T4096_K256_V64": Case("strong_T4096_K256_V64", T=4096, H=4, K=256, V=64, gates="lower"),
    "softplus_T4096_K100_V72_bf16in": Case("softplus_T4096_K100_V72_bf16in", T=4096, H=4, K=100, V=72,
                                           gate="softplus", dtype="bfloat16", chunk_size=32),
}


@pytest.fixture(scope="module")
def reference_cache():
    cache = {}

    def get(name):
        if name not in cache:
            cache.clear()  # one large reference in memory at a time
            inputs, cfg = make_inputs(BIG[name], seed=7)
            cache[name] = (inputs, cfg, run_reference(inputs, cfg, taps=TAP_NAMES, device="cuda"))
        return cache[name]
    return get


def _tap_mask(name, lengths, shape):
    """True on valid rows (and columns, for [C,C] taps) of ``[n_chunks, n_heads, *shape]``."""
    m = torch.ones(shape, dtype=torch.bool)
    for axis in REGISTRY[name].row_dims:
        dim = 2 + axis
        rows = torch.arange(shape[dim])
        view = [1] * len(shape)
        view[0], view[dim] = shape[0], shape[dim]
        m = m & (rows[None, :] < lengths[:, None]).reshape(view)
    return m


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(BIG))
def test_large_against_reference(reference_cache, name, precision):
    inputs, cfg, ref = reference_cache(name)
    tols = TOLERANCES[precision]
    out, taps, _ = run_kernels(inputs, cfg, precision, "cuda", taps=TapSelection())
    rows = [compare(key, out[key], ref.outputs[key]).judge(tols[key]) for key in outputs_that_apply(inputs, cfg)]
    from kdadbg.run import carry_from_dg
    carry_from_dg(rows, out, ref.outputs, inputs, cfg)   # dA_log/ddt_bias judged as run judges them
    for c in rows:
        assert c.passed or c.carried is not None, c
    if precision == "fp32":
        for key in TAP_NAMES:
            if key in OVERFLOWING and cfg.chunk_size > 16:
                continue
            mask = _tap_mask(key, ref.chunks.length, tuple(ref.taps[key].shape))
            c = compare(key, taps[key], ref.taps[key], mask).judge(1e-5)
            assert c.passed, c


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_taps_do_not_change_bits_and_runs_repeat(precision):
    inputs, cfg = make_inputs(BIG["varlen_mixed6_H16"], seed=3)
    plain, _, _ = run_kernels(inputs, cfg, precision, "cuda")
    again, _, _ = run_kernels(inputs, cfg, precision, "cuda")
    window, taps, _ = run_kernels(inputs, cfg, precision, "cuda", taps=TapSelection(chunks=(100, 164)))
    everything, _, _ = run_kernels(inputs, cfg, precision, "cuda", taps=TapSelection())
    for key, t in plain.items():
        assert torch.equal(t, again[key]), f"{key}: two runs differ"
        assert torch.equal(t, window[key]), f"{key}: taps on a window change the bits"
        assert torch.equal(t, everything[key]), f"{key}: all taps change the bits"
    for key, t in taps.items():
        assert t.shape[0] == 64 and not torch.isnan(t[:, :, ...]).all(), key


# bf16 mode with unnormalised keys (l2norm off): dA_log [H] and ddt_bias [H, K] are sums over every
# token of dg terms that cancel, so bf16/tf32 rounding upstream shows at fla's bar. CPU emulation over
# 12 seeds of the `raw` case: dA_log worst 1.9x its tolerance (mean 0.55x), ddt_bias worst 1.14x (mean
# 0.56x); with l2norm (`basic`, `beta_high`) the worst is 0.97x. fla's bars were set with l2norm'd keys;
# outside that regime these two are judged by direction (cosine), the FlashKDA fork's criterion.
RAW_KEY_PARAMS = ("dA_log", "ddt_bias")
RAW_KEY_COSINE = 0.999


def test_bf16_case_table_on_gpu():
    """The CPU case table, on the GPU, in bf16 mode with fla's tolerances (every failure listed)."""
    from kdadbg.cases import KERNEL_CASES

    failures = []
    for case in KERNEL_CASES:
        case = dataclasses.replace(case, T=max(case.T, 1))
        inputs, cfg = make_inputs(case, seed=11)
        ref = run_reference(inputs, cfg, taps=(), device="cuda")
        out, _, _ = run_kernels(inputs, cfg, "bf16", "cuda")
        for key in outputs_that_apply(inputs, cfg):
            c = compare(key, out[key], ref.outputs[key]).judge(TOLERANCES["bf16"][key])
            if not cfg.qk_l2norm and key in RAW_KEY_PARAMS and c.nonfinite == 0:
                c.passed = c.passed or c.cosine >= RAW_KEY_COSINE
            if not c.passed:
                failures.append((case.name, c))
    assert not failures, failures


# The realistic presets (fla's KimiDeltaAttention init, Kimi's lower-bound gate) at a model's size:
# T 8192, H 8, K = V = 128; the varlen forms with the peer benchmark's mixed lengths scaled to 8192 tokens
# (and, for kimi_varlen, a 9-token sequence first, as in its CI form).
MIXED_8192 = (0, 1300, 1847, 3895, 4858, 5129, 8192)
REAL_GPU = {
    "fla_layer": {}, "kimi": {}, "kimi_c64": {},
    "fla_layer_varlen": {"cu_seqlens": MIXED_8192},
    "kimi_varlen": {"cu_seqlens": (0, 9, 1309, 1856, 3904, 4867, 5138, 8192)},
}


def _not_ok(res, limit=12):
    """The failing cells that are not UNREP, compactly: (tap, chunk, head, label, ratio, floor, tol)."""
    from kdadbg.noise import LABELS, OK, UNREP

    out = []
    for n, c in res.cells.items():
        for r, h in ((c.label != OK) & (c.label != UNREP)).nonzero().tolist():
            out.append((n, c.chunks[r], c.heads[h], LABELS[int(c.label[r, h])], float(c.ratio[r, h]),
                        None if c.floor is None else float(c.floor[r, h]), c.tol))
    return out[:limit]


def _real_gpu(name):
    from kdadbg.cases import get_case

    return make_inputs(dataclasses.replace(get_case(name), T=8192, H=8, K=128, V=128, **REAL_GPU[name]), seed=1)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(REAL_GPU))
def test_diff_is_quiet_on_realistic_presets_at_model_size(name, precision):
    """issue 24's "quiet on clean" at GPU sizes: every tap and output row compared, no BUG, and the diff passes;
    in fp32 mode a DRIFT cell only within twice its noise floor (the float32 reference's own error): round 41
    call 1 (H100) found kimi_varlen's dg at chunk 53, head 1, 1.27e-5 against fp32's 1e-5, its floor 7.4e-6
    (1.7x), a cell the fp32 tolerance is tight for, not an error of the kernels."""
    from kdadbg.diff import diff_dump
    from kdadbg.impls import resolve_impl

    inputs, cfg = _real_gpu(name)
    res = diff_dump(inputs, cfg, resolve_impl("ours", precision, None), device="cuda", window=0)
    n = res.counts()
    assert n["tap_cells"] > 0 and n["row_cells"] > 0 and n["bug"] == 0, (n, _not_ok(res))
    if precision == "fp32":
        from kdadbg.noise import DRIFT

        over = [(name, c.chunks[r], c.heads[h], float(c.ratio[r, h]), float(c.floor[r, h]))
                for name, c in res.cells.items() for r, h in (c.label == DRIFT).nonzero().tolist()
                if not float(c.ratio[r, h]) <= 2 * float(c.floor[r, h])]
        assert not over, (n, over)
    assert res.passed, (n, _not_ok(res))


@pytest.mark.parametrize("fault,name,chunk,tap", [
    ("dL_sign", "fla_layer", 40, "dL"),
    ("ln2_twice", "kimi_c64", 70, "dgc"),
    ("gate_padding", "fla_layer_varlen", 20, "gT"),   # seq 0 (1300 tokens) ends in chunk 20, a tail
    ("varlen_offset", "kimi_varlen", 200, "gc"),
    ("dgT_after_update", "kimi", 300, "dgT"),
])
def test_planted_fault_is_named_on_realistic_presets_at_model_size(fault, name, chunk, tap):
    """Loud on bugs at GPU sizes: the planted fault is the first divergence, at its tap and chunk, a BUG,
    introduced there (the window rerun on the GPU)."""
    from kdadbg.diff import diff_dump
    from kernel_faults import plant

    inputs, cfg = _real_gpu(name)
    with plant(fault, chunk):
        res = diff_dump(inputs, cfg, device="cuda")
    first = res.first_divergence
    assert (first["tap"], first["chunk"], first["label"]) == (tap, chunk, "BUG"), (first, _not_ok(res))
    assert res.origin["verdict"] == "introduced" and not res.passed


@pytest.mark.parametrize("chunk, bv, D", [(c, bv, 128) for c in (16, 32, 64) for bv in ("16", "32", "64")]
                         + [(c, "64", 64) for c in (16, 32, 64)])
def test_fused_state_pass_matches_the_w_u_kernel_on_cuda(chunk, bv, D, monkeypatch):
    """``FWD_FUSE_WU=1`` (the state pass forms ``U`` itself; ``recurrence.wu_transposed`` picks the product's
    form) against ``FWD_FUSE_WU=0`` on the same inputs at every chunk size and V block: the training forward's
    ``o``, ``ht`` and every row of ``U``, and the inference forward's ``o`` and ``ht``, within 2e-2 of the
    largest magnitude (bf16 roundings: 2e-3 to 7e-3 in docs/gpu/round59; the pipelined ``INV vc`` product at 16
    and 32 columns gave errors of 0.19 to 1e37, NaN, or an illegal memory access). Lower-bound gate, a varlen
    batch of four sequences (one of 9 tokens); K = V = 128, and K = V = 64 at 64 columns (a smaller
    state tile: the pass's pipeline may take another stage count, where round 59 checked 2 stages only)."""
    from kdadbg_kernels.chunk import kda_forward

    torch.manual_seed(3)
    H, T = 2, 1289
    dev = "cuda"
    q, k, g, v = (torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
    beta = torch.randn(1, T, H, device=dev, dtype=torch.bfloat16)
    cu = torch.tensor([0, 9, 500, 1024, T], device=dev, dtype=torch.int32)
    kw = dict(scale=D ** -0.5, chunk_size=chunk, gate="lower_bound", lower_bound=-5.0, cu_seqlens=cu,
              A_log=torch.randn(H, device=dev) * 0.5, dt_bias=torch.randn(H, D, device=dev) * 0.1,
              out_dtype=torch.bfloat16, precision="bf16")
    monkeypatch.setenv("KDADBG_REC_BV", bv)
    runs = {}
    for fuse in ("0", "1"):
        monkeypatch.setenv("KDADBG_FWD_FUSE_WU", fuse)
        for keep in (True, False):
            o, ht, saved, _ = kda_forward(q, k, v, g, beta, keep_state=keep, **kw)
            runs[fuse, keep] = (o.float(), ht, None if saved.U is None else saved.U.float())
    torch.cuda.synchronize()
    o0, ht0, U0 = runs["0", True]
    assert runs["1", True][2] is not None and runs["1", False][2] is None
    for keep in (True, False):
        o1, ht1, _ = runs["1", keep]
        for name, a, b in (("o", o1, o0), ("ht", ht1, ht0)):
            err = float((a - b).abs().max() / b.abs().max())
            assert a.isfinite().all() and err < 2e-2, (name, keep, err)
    U1 = runs["1", True][2]
    row_err = (U1 - U0).abs().amax(dim=(1, 2)) / U0.abs().max()
    assert U1.isfinite().all() and float(row_err.max()) < 2e-2, float(row_err.max())
    assert float(row_err.max()) > 0  # the knob acted: U moved by roundings
