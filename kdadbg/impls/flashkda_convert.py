"""FlashKDA's buffers -> kdadbg's registry taps: the layouts read from its CUDA source and the conversions.

FlashKDA (MoonshotAI, and the fork that adds a backward) keeps its per-chunk intermediates in flat
``uint8`` workspaces of "separated arrays": section after section, each ``[H * total_tiles, *per tile]``
row-major, tile slot ``h * total_tiles + tile`` (``fwd_launch.cu``: ``ws_* = ws + n_ht * (...)``,
``fwd_kernel1.cuh``: ``ws_idx = head_idx * total_tiles + global_tile_idx``). ``total_tiles`` is the
launch's: ``N * ceil(T / 16)`` batched (exact), ``ceil(B*T / 16) + N`` varlen (an upper bound; the real
tiles are the first ``sum_n ceil(len_n / 16)``, numbered ``tile_base(n) + t`` exactly as kdadbg numbers
chunks at chunk size 16, so tile = registry chunk).

Conventions converted here (each FlashKDA buffer -> registry tap; ``TAP_SOURCES`` lists them):

* gates in log2 units: ``gc`` (the fork's ``g_cumsum``, the inclusive fp32 cumsum of
  ``gate_scale * sigmoid(.)``, ``gate_scale = lb * log2 e``) is ``gc_registry / ln 2``, so ``gc = buf * ln 2``;
* ``g_total`` holds ``2^{Gt} = exp(gT)`` (exponentiated in place before its store), so ``gT = ln(buf)``
  for the upstream build; the fork has ``g_cumsum``, and ``gT = g_cumsum[row 15] * ln 2`` (padding rows add 0);
* gradients (``dkd, dqd, dki, dkr``, ``dgT``, ``db``, ``dgc``) are fp32 and already natural-log: the fork's
  backward leaves ln 2 out of ``dgT`` and ``dgc`` and puts it in once, at the sigmoid step (spec §6.2);
* states are ``[V,K]`` (``all_states``, like ``h0``): ``S = buf^T``;
* storage bf16 (``kd qd kr ki INV Mqk S``; ``INV`` was fp16 on chip, converted to bf16 for its store);
* padding rows (``>= n_valid``): ``qd`` there holds the next tokens' data (q is not zeroed), everything
  is set to 0 here as the registry exports padding.
"""

from __future__ import annotations

import math

import torch

from kdadbg_kernels.taps import REGISTRY

from ..tapsfile import zero_padding

CHUNK = 16
D = 128
LN2 = math.log(2.0)

BF16, FP32 = torch.bfloat16, torch.float32

# Forward workspace sections in order (name, dtype, per-tile shape): upstream fwd_launch.cu lines 64-71
# and the fork's fwd_launch.cu / bwd_launch.cu lines 92-106 (WorkspaceSizes in smxx/utils.cuh).
FWD_SECTIONS = {
    "upstream": (("kd", BF16, (CHUNK, D)), ("qd", BF16, (CHUNK, D)), ("kr", BF16, (CHUNK, D)),
                 ("g_total", FP32, (D,)), ("INV", BF16, (CHUNK, CHUNK)), ("Mqk", BF16, (CHUNK, CHUNK))),
    "fork": (("kd", BF16, (CHUNK, D)), ("qd", BF16, (CHUNK, D)), ("kr", BF16, (CHUNK, D)),
             ("ki", BF16, (CHUNK, D)), ("g_total", FP32, (D,)), ("INV", BF16, (CHUNK, CHUNK)),
             ("Mqk", BF16, (CHUNK, CHUNK)), ("g_cumsum", FP32, (CHUNK, D)),
             ("kd_fp32", FP32, (CHUNK, D)), ("qd_fp32", FP32, (CHUNK, D)), ("ki_fp32", FP32, (CHUNK, D)),
             ("kr_fp32", FP32, (CHUNK, D))),
}
# The fork's backward workspace (bwd_launch.cu lines 113-131) plus the dgc section the taps patch adds.
BWD_SECTIONS = (("dkd", FP32, (CHUNK, D)), ("dqd", FP32, (CHUNK, D)), ("dki", FP32, (CHUNK, D)),
                ("dkr", FP32, (CHUNK, D)), ("dv", BF16, (CHUNK, D)), ("dgT", FP32, (D,)),
                ("db", FP32, (CHUNK,)), ("dgc", FP32, (CHUNK, D)))

# registry tap -> (build that has it, FlashKDA buffer, conversion), for the README and the adapter.
TAP_SOURCES = {
    "gc": ("fork", "fwd workspace g_cumsum, fp32 [16,128], log2", "x ln 2"),
    "gT": ("upstream", "fwd workspace g_total, fp32 [128], holds 2^Gt",
           "ln(x) (upstream); fork: g_cumsum row 15 x ln 2"),
    "qd": ("upstream", "fwd workspace q_decayed, bf16 [16,128]", "as is (scale rounded to bf16 inside)"),
    "kd": ("upstream", "fwd workspace k_decayed, bf16 [16,128]", "as is"),
    "ki": ("fork", "fwd workspace k_inv, bf16 [16,128]", "as is"),
    "kr": ("upstream", "fwd workspace k_restored, bf16 [16,128]", "as is"),
    "INV": ("upstream", "fwd workspace INV, bf16 [16,16] (fp16 Neumann product on chip)", "as is"),
    "Mqk": ("upstream", "fwd workspace Mqk, bf16 [16,16]", "as is"),
    "S": ("fork", "all_states, bf16 [V,K] per tile", "transpose"),
    "dkd": ("fork+patch", "bwd workspace dkd, fp32 [16,128]", "as is"),
    "dqd": ("fork+patch", "bwd workspace dqd, fp32 [16,128]", "as is"),
    "dki": ("fork+patch", "bwd workspace dki, fp32 [16,128]", "as is"),
    "dkr": ("fork+patch", "bwd workspace dkr, fp32 [16,128]", "as is"),
    "dgT": ("fork+patch", "bwd workspace dgT, fp32 [128], ln2-free", "as is"),
    "db": ("fork+patch", "bwd workspace dbeta, fp32 [16], d loss / d sigmoid(beta)", "as is"),
    "dgc": ("fork+patch", "bwd workspace dgc (added by the patch), fp32 [16,128], ln2-free", "as is"),
}
# Registry taps no FlashKDA build keeps in global memory (shared memory or registers only).
NEVER_STORED = {
    "b": "sigmoid(beta) is formed in shared memory by each kernel",
    "L": "fp16 in shared memory only (INV = (I + L)^-1 is stored)",
    "vcorr": "recomputed in registers (forward) and shared memory (backward)",
    "U": "recomputed in registers (forward) and shared memory (backward)",
    "dS": "accumulated in shared memory, only dh0 leaves the kernel",
    "dU": "shared memory of the backward recurrence",
    "dMqk": "shared memory of the backward recurrence",
    "dvcorr": "shared memory of the backward recurrence",
    "dL": "shared memory of the backward recurrence",
}
BF16_TAPS = ("kd", "qd", "kr", "ki", "INV", "Mqk", "S")   # stored in bf16 (INV from fp16): their floor rounds too

BUILD_TAPS = {
    "upstream": ("gT", "qd", "kd", "kr", "INV", "Mqk"),
    "fork": ("gc", "gT", "qd", "kd", "ki", "kr", "INV", "Mqk", "S"),
    "fork+patch": ("gc", "gT", "qd", "kd", "ki", "kr", "INV", "Mqk", "S",
                   "dkr", "dqd", "dkd", "dki", "db", "dgT", "dgc"),
}


def total_tiles(B: int, T: int, N: int, varlen: bool) -> int:
    """The launch's ``total_tiles`` (flash_kda.cpp: exact batched, an upper bound varlen)."""
    return (B * T + CHUNK - 1) // CHUNK + N if varlen else N * ((T + CHUNK - 1) // CHUNK)


def section_nbytes(sections, n_ht: int) -> int:
    return sum(n_ht * math.prod(shape) * torch.empty((), dtype=dt).element_size() for _, dt, shape in sections)


def split_workspace(ws: torch.Tensor, sections, H: int, tiles: int) -> dict[str, torch.Tensor]:
    """Views ``[H, tiles, *per tile]`` of each section of the flat ``uint8`` workspace ``ws``."""
    n_ht = H * tiles
    need = section_nbytes(sections, n_ht)
    if ws.dtype != torch.uint8 or ws.ndim != 1 or ws.numel() < need:
        raise ValueError(f"workspace: expected uint8 [>= {need}], found {ws.dtype} {list(ws.shape)}")
    out, off = {}, 0
    for name, dt, shape in sections:
        n = n_ht * math.prod(shape) * torch.empty((), dtype=dt).element_size()
        out[name] = ws[off:off + n].view(dt).view(H, tiles, *shape)
        off += n
    return out


def _chunk_major(buf: torch.Tensor, n_chunks: int) -> torch.Tensor:
    """``[H, tiles, ...]`` -> ``[n_chunks, H, ...]`` float64 (the real tiles come first)."""
    return buf[:, :n_chunks].transpose(0, 1).to(torch.float64)


def convert(bufs: dict[str, torch.Tensor], lengths: torch.Tensor, names) -> dict[str, torch.Tensor]:
    """Registry taps ``[n_chunks, H, *shape]`` (float64, natural-log gates, ``[K,V]`` states, padding 0)
    from FlashKDA buffers ``[H, tiles, *per tile]`` (workspace sections by their FlashKDA names, and
    ``all_states`` as ``S``). ``lengths``: valid rows of each chunk. Taps whose buffer is absent are skipped.
    """
    n = int(lengths.numel())
    out = {}
    for name in names:
        if name == "gc" and "g_cumsum" in bufs:
            t = _chunk_major(bufs["g_cumsum"], n) * LN2
        elif name == "gT" and "g_cumsum" in bufs:
            t = _chunk_major(bufs["g_cumsum"][:, :, CHUNK - 1], n) * LN2
        elif name == "gT" and "g_total" in bufs:
            t = torch.log(_chunk_major(bufs["g_total"], n))
        elif name == "S" and "S" in bufs:
            t = _chunk_major(bufs["S"], n).transpose(-1, -2)
        elif name in bufs and name in TAP_SOURCES:
            t = _chunk_major(bufs[name], n)
        else:
            continue
        out[name] = zero_padding(name, t.contiguous(), lengths.to(t.device))
    return out


def check_shapes(taps: dict[str, torch.Tensor], n_chunks: int, H: int) -> None:
    """Every converted tap has the registry's per-chunk shape at chunk 16, K = V = 128."""
    for name, t in taps.items():
        want = (n_chunks, H, *REGISTRY[name].dims(CHUNK, D, D))
        if tuple(t.shape) != want:
            raise ValueError(f"flashkda tap {name}: shape {list(t.shape)}, expected {list(want)}")
