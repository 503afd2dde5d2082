"""The shared case table: named input regimes used by the tests and by ``kdadbg gen``.

Each case is a small, fully specified dump recipe. The regimes come from the bugs real KDA
kernels had (``shared/peers.md``): tail chunks, varlen with sequences shorter than a chunk,
gates at the lower bound or at zero, beta near 0 and 1, non-zero states, both layouts,
K != V, every gate mode and chunk size. The ``layer`` gates are the statistics a model runs at:
fla's ``KimiDeltaAttention`` initialisation (``A_log = log U(1, 16)`` per head, ``dt_bias`` the
inverse softplus of ``dt = exp(U(log 1e-3, log 1e-1))`` per head and channel) with raw,
roughly unit-variance projections for q, k, v, g and the beta logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from .config import KDAConfig, KDAInputs

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


@dataclass(frozen=True)
class Case:
    name: str
    B: int = 1
    T: int = 40
    H: int = 2
    HV: int | None = None        # value heads (GVA: a multiple of H); None: H
    K: int = 16
    V: int = 16
    cu_seqlens: tuple[int, ...] | None = None
    gate: str = "lower_bound"
    gates: str = "random"        # random | lower (at the lower bound) | zero (no decay) | masked | layer
    betas: str = "random"        # random | low (b near 0) | high (b near 1)
    chunk_size: int = 16
    state_layout: str = "vk"
    h0: bool = True
    dht: bool = True
    qk_l2norm: bool = True
    beta_sigmoid: bool = True
    lower_bound: float = -5.0
    dtype: str = "float32"
    kernels: bool = True         # False: outside the kernels' documented range (reference only)
    note: str = field(default="", compare=False)

    @property
    def n_value_heads(self) -> int:
        return self.H if self.HV is None else self.HV

    @property
    def config(self) -> KDAConfig:
        return KDAConfig(scale=self.K ** -0.5, chunk_size=self.chunk_size, gate=self.gate,
                         lower_bound=self.lower_bound, qk_l2norm=self.qk_l2norm,
                         beta_sigmoid=self.beta_sigmoid, state_layout=self.state_layout)


def _c(name, note, **kw) -> Case:
    return Case(name=name, note=note, **kw)


CASES: tuple[Case, ...] = (
    _c("basic", "B=2, T=40 (tail chunk), H=2, lower_bound gate, h0 and dht", B=2),
    _c("t1", "a single token", T=1, H=1),
    _c("t15", "one partial chunk", T=15, H=3),
    _c("t16", "exactly one chunk", T=16, H=1),
    _c("tail", "T=17: a one-row tail chunk", T=17, H=3),
    _c("t63", "T=63", T=63, H=1, K=24, V=16),
    _c("t64", "T=64", T=64, H=3),
    _c("t65", "T=65", T=65, H=1),
    _c("t200", "T=200, K != V", T=200, H=3, K=16, V=24),
    _c("varlen", "cu_seqlens [0,15,100,300], H=3", T=300, H=3, cu_seqlens=(0, 15, 100, 300)),
    _c("varlen_short", "cu_seqlens [0,1,17,33]: sequences shorter than a chunk", T=33, H=2,
       cu_seqlens=(0, 1, 17, 33)),
    _c("k_ne_v", "K=32, V=16", T=50, K=32, V=16),
    _c("v_gt_k", "K=16, V=48", T=50, K=16, V=48),
    # none gate: with one head and K = 8, bf16 mode's dA_log (one scalar summing cancelling terms) missed
    # fla's bar by 13x in CPU emulation (bf16_margin.py, seed 11), the limit docs/kernels.md describes
    _c("k8", "K=8, V=12: dims under 16 (padded blocks)", T=40, H=1, K=8, V=12,
       gate="none"),
    _c("gate_none", "g is the natural-log decay", gate="none"),
    _c("gate_softplus", "-exp(A_log) softplus(g + dt_bias)", gate="softplus"),
    _c("strong_gates", "every token at the lower bound (-5)", gates="lower", T=70),
    _c("strong_gates_none", "g = -5 per token with the none gate", gate="none", gates="lower", T=70),
    _c("strong_gates_softplus", "softplus gate about -5 per token", gate="softplus", gates="lower"),
    _c("zero_gates", "gates at 0 (no decay)", gates="zero", T=70),
    _c("zero_gates_none", "g = 0 with the none gate", gate="none", gates="zero"),
    _c("beta_low", "beta near 0", betas="low"),
    _c("beta_high", "beta near 1", betas="high"),
    _c("raw", "l2norm and beta sigmoid off", qk_l2norm=False, beta_sigmoid=False),
    _c("raw_beta_extremes", "beta sigmoid off, beta near 1", beta_sigmoid=False, betas="high"),
    _c("no_state", "no h0, no dht", h0=False, dht=False),
    _c("h0_only", "h0 without dht", dht=False),
    _c("dht_only", "dht without h0", h0=False),
    _c("kv_layout", "states in [N,H,K,V]", state_layout="kv", K=16, V=24),
    _c("varlen_kv", "varlen with the kv layout", T=60, cu_seqlens=(0, 7, 40, 60), state_layout="kv"),
    _c("chunk32", "chunk 32, T=100", chunk_size=32, T=100),
    _c("chunk64", "chunk 64, T=130", chunk_size=64, T=130, H=1),
    _c("chunk64_varlen", "chunk 64, varlen [0,5,70,150]", chunk_size=64, T=150, H=1,
       cu_seqlens=(0, 5, 70, 150)),
    _c("chunk64_strong", "chunk 64 with gates at the lower bound", chunk_size=64, gates="lower", T=64,
       H=1),
    _c("bf16", "bf16 inputs", dtype="bfloat16", T=50),
    # a model's statistics (gates="layer", no states: a training call). Seeds 0-2: with the softplus gate
    # the within-chunk cumulative gate reaches -66 to -120 on the head with the larger A (-101 at seed 0),
    # so ki = kn exp(-gc) is e^100 there; with the -5 lower bound it stays at -3 to -37
    _c("fla_layer", "fla's KimiDeltaAttention: softplus gate, layer init, bf16", gate="softplus",
       gates="layer", chunk_size=64, T=256, K=32, V=32, h0=False, dht=False, dtype="bfloat16"),
    _c("fla_layer_varlen", "fla_layer, cu_seqlens [0,30,200,300]", gate="softplus", gates="layer",
       chunk_size=64, T=300, K=32, V=32, h0=False, dht=False, dtype="bfloat16", cu_seqlens=(0, 30, 200, 300)),
    _c("kimi", "Kimi/FlashKDA: lower-bound gate -5, layer init, bf16", gates="layer", T=128, K=32, V=32,
       h0=False, dht=False, dtype="bfloat16"),
    _c("kimi_c64", "kimi at chunk 64", gates="layer", chunk_size=64, T=256, K=32, V=32, h0=False,
       dht=False, dtype="bfloat16"),
    _c("kimi_varlen", "kimi, cu_seqlens [0,9,100,160]", gates="layer", T=160, K=32, V=32, h0=False,
       dht=False, dtype="bfloat16", cu_seqlens=(0, 9, 100, 160)),
    _c("gva", "grouped value heads: H=2 q/k heads, HV=4 value heads (hv reads q/k head hv // 2), T=40", H=2,
       HV=4),
    _c("gva_varlen", "GVA H=1, HV=3, cu_seqlens [0,5,21,50], kv layout, softplus gate", T=50, H=1, HV=3,
       cu_seqlens=(0, 5, 21, 50), gate="softplus", state_layout="kv"),
    _c("masked_gates", "none gate with a third of the tokens masked to -1000 (reference only)",
       gate="none", gates="masked", T=50, kernels=False),
)

CASE_NAMES = tuple(c.name for c in CASES)
KERNEL_CASES = tuple(c for c in CASES if c.kernels)
BY_NAME = {c.name: c for c in CASES}


def get_case(name: str) -> Case:
    return BY_NAME[name]


def make_inputs(case: Case, seed: int = 0) -> tuple[KDAInputs, KDAConfig]:
    """Random inputs for ``case`` (deterministic in ``seed``), in the case's dtype."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    def uniform(lo, hi, *shape):
        return lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=torch.float64)

    B, T, Hq, K, V = case.B, case.T, case.H, case.K, case.V
    H = case.n_value_heads   # every tensor but q, k is per value head
    if case.HV is not None and (case.HV < case.H or case.HV % case.H):
        raise ValueError(f"case {case.name}: HV={case.HV} must be a multiple of H={case.H}")
    if case.cu_seqlens is not None:
        B = 1
        if case.cu_seqlens[-1] != T:
            raise ValueError(f"case {case.name}: cu_seqlens must end at T={T}")
    N = B if case.cu_seqlens is None else len(case.cu_seqlens) - 1
    q, k = randn(B, T, Hq, K), randn(B, T, Hq, K)
    v = randn(B, T, H, V)
    A_log = dt_bias = None
    if case.gate == "none":
        g = {"random": torch.nn.functional.logsigmoid(randn(B, T, H, K) + 2.0),
             "lower": torch.full((B, T, H, K), case.lower_bound, dtype=torch.float64),
             "zero": torch.zeros(B, T, H, K, dtype=torch.float64),
             "masked": torch.where(torch.rand(B, T, H, 1, generator=gen) < 1 / 3,
                                   torch.tensor(-1000.0, dtype=torch.float64),
                                   torch.nn.functional.logsigmoid(randn(B, T, H, K) + 2.0))}[case.gates]
    elif case.gates == "layer":  # fla's KimiDeltaAttention initialisation; g a raw projection
        A_log = uniform(1.0, 16.0, H).log()
        dt = uniform(math.log(1e-3), math.log(1e-1), H, K).exp()
        dt_bias = dt + torch.log(-torch.expm1(-dt))
        g = randn(B, T, H, K)
    else:
        A_log = uniform(-0.5, 0.5, H)
        dt_bias = uniform(-1.0, 1.0, H, K)
        if case.gate == "lower_bound":
            g = {"random": randn(B, T, H, K), "lower": 40.0 + randn(B, T, H, K).abs(),
                 "zero": -60.0 - randn(B, T, H, K).abs()}[case.gates]
        else:
            if case.gates == "lower":   # -exp(A_log) softplus(g + dt_bias) close to -5
                A_log = torch.zeros(H, dtype=torch.float64)
                g = 5.0 - dt_bias[None, None] + 0.1 * randn(B, T, H, K)
            else:
                g = {"random": randn(B, T, H, K) - 1.0, "zero": -60.0 - randn(B, T, H, K).abs()}[case.gates]
    logits = {"random": randn(B, T, H), "low": -14.0 - randn(B, T, H).abs(),
              "high": 14.0 + randn(B, T, H).abs()}[case.betas]
    if case.beta_sigmoid:
        beta = logits
    else:
        beta = {"random": torch.sigmoid(logits), "low": torch.full((B, T, H), 1e-6, dtype=torch.float64),
                "high": torch.full((B, T, H), 1.0 - 1e-6, dtype=torch.float64)}[case.betas]
    do = randn(B, T, H, V)
    state = (N, H, V, K) if case.state_layout == "vk" else (N, H, K, V)
    h0 = randn(*state, std=0.5) if case.h0 else None
    dht = randn(*state, std=0.5) if case.dht else None
    cu = torch.tensor(case.cu_seqlens, dtype=torch.int64) if case.cu_seqlens is not None else None
    dt = DTYPES[case.dtype]
    inputs = KDAInputs(q=q, k=k, v=v, g=g, beta=beta, do=do, dht=dht, h0=h0, cu_seqlens=cu,
                       A_log=A_log, dt_bias=dt_bias)
    out = {}
    for name, t in inputs.items():
        if name in ("A_log", "dt_bias"):
            out[name] = t.float()
        elif t.is_floating_point():
            out[name] = t.to(dt)
        else:
            out[name] = t
    return KDAInputs(**out), case.config


def with_size(case: Case, **kw) -> Case:
    return replace(case, **kw)
