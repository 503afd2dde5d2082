"""Tap registry v1: the per-chunk intermediates of the chunked KDA algorithm.

This is the single declaration of tap names, stages, per-chunk shapes and meanings
(the contract of ``shared/spec/kda-math.md`` §9). The kernels allocate tap buffers from it,
the float64 reference returns dicts keyed by it, and the export, diff and report code iterate
over it. Gates are natural-log; states use the math layout ``[K, V]``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

# torch is imported where a buffer is made: the registry itself (names, stages, shapes) is read by
# ``kdadbg --help`` and the command line's option checks, which then start without importing torch

STAGES = ("fwd_prepare", "fwd_recurrence", "bwd_recurrence", "bwd_prepare")

OUTPUTS = ("o", "ht")
GRADIENTS = ("dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias")


@dataclass(frozen=True)
class Tap:
    name: str
    stage: str
    shape: tuple[str, ...]  # symbolic per-chunk dims, each "C", "K" or "V"
    meaning: str

    def dims(self, C: int, K: int, V: int) -> tuple[int, ...]:
        size = {"C": C, "K": K, "V": V}
        return tuple(size[d] for d in self.shape)

    @property
    def row_dims(self) -> tuple[int, ...]:
        """Axes (of the per-chunk shape) indexed by a chunk row: padding lives there."""
        return tuple(i for i, d in enumerate(self.shape) if d == "C")


TAPS: tuple[Tap, ...] = (
    Tap("gc", "fwd_prepare", ("C", "K"), "inclusive within-chunk cumsum of the activated log-decay"),
    Tap("gT", "fwd_prepare", ("K",), "chunk total of the log-decay (gc at the last valid row)"),
    Tap("b", "fwd_prepare", ("C",), "write strength after activation"),
    Tap("qd", "fwd_prepare", ("C", "K"), "scale * qn * exp(gc)"),
    Tap("kd", "fwd_prepare", ("C", "K"), "kn * exp(gc)"),
    Tap("ki", "fwd_prepare", ("C", "K"), "kn * exp(-gc)"),
    Tap("kr", "fwd_prepare", ("C", "K"), "kn * exp(gT - gc)"),
    Tap("L", "fwd_prepare", ("C", "C"), "Diag(b) strict_tril(kd ki^T)"),
    Tap("INV", "fwd_prepare", ("C", "C"), "(I + L)^-1"),
    Tap("Mqk", "fwd_prepare", ("C", "C"), "tril(qd ki^T), diagonal included"),
    Tap("S", "fwd_recurrence", ("K", "V"), "state entering the chunk"),
    Tap("vcorr", "fwd_recurrence", ("C", "V"), "Diag(b) (v - kd S)"),
    Tap("U", "fwd_recurrence", ("C", "V"), "INV vcorr"),
    Tap("dS", "bwd_recurrence", ("K", "V"), "dloss/dS of the state entering the chunk"),
    Tap("dU", "bwd_recurrence", ("C", "V"), "Mqk^T dO + kr dS[c+1]"),
    Tap("dkr", "bwd_recurrence", ("C", "K"), "U dS[c+1]^T"),
    Tap("dMqk", "bwd_recurrence", ("C", "C"), "tril(dO U^T)"),
    Tap("dvcorr", "bwd_recurrence", ("C", "V"), "INV^T dU"),
    Tap("dL", "bwd_recurrence", ("C", "C"), "-strict_tril(dvcorr U^T)"),
    Tap("dqd", "bwd_recurrence", ("C", "K"), "dO S^T + dMqk ki"),
    Tap("dkd", "bwd_recurrence", ("C", "K"), "-Diag(b) dvcorr S^T + Diag(b) dL ki"),
    Tap("dki", "bwd_recurrence", ("C", "K"), "dMqk^T qd + (Diag(b) dL)^T kd"),
    Tap("db", "bwd_recurrence", ("C",), "dloss/db (post-activation)"),
    Tap("dgT", "bwd_recurrence", ("K",), "exp(gT) rowsum(dS[c+1] * S) + colsum(dkr * kr)"),
    Tap("dgc", "bwd_prepare", ("C", "K"), "dloss/dgc, excluding the dgT path"),
)

TAP_NAMES: tuple[str, ...] = tuple(t.name for t in TAPS)
REGISTRY: dict[str, Tap] = {t.name: t for t in TAPS}


@dataclass(frozen=True)
class TapSelection:
    """Which taps to record: names, a half-open global chunk range and a list of heads.

    ``chunks=None`` means every chunk, ``heads=None`` every head.
    """

    names: tuple[str, ...] = TAP_NAMES
    chunks: tuple[int, int] | None = None
    heads: tuple[int, ...] | None = None

    def __post_init__(self):
        unknown = [n for n in self.names if n not in REGISTRY]
        if unknown:
            raise ValueError(f"unknown tap name(s) {unknown}; known: {', '.join(TAP_NAMES)}")

    def chunk_range(self, n_chunks: int) -> tuple[int, int]:
        if self.chunks is None:
            return 0, n_chunks
        lo, hi = self.chunks
        hi = min(n_chunks, hi)
        return min(max(0, lo), max(hi, 0)), max(hi, 0)

    def head_list(self, n_heads: int) -> tuple[int, ...]:
        return tuple(range(n_heads)) if self.heads is None else tuple(self.heads)

    def nbytes(self, n_chunks: int, n_heads: int, C: int, K: int, V: int, itemsize: int = 4) -> int:
        lo, hi = self.chunk_range(n_chunks)
        per = sum(_numel(REGISTRY[n].dims(C, K, V)) for n in self.names)
        return (hi - lo) * len(self.head_list(n_heads)) * per * itemsize


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def alloc_tap_buffers(sel: TapSelection, n_chunks: int, n_heads: int, C: int, K: int, V: int,
                      device, dtype=None) -> dict:
    """NaN-filled buffers ``[n_sel_chunks, n_sel_heads, *per-chunk shape]`` for each selected tap (float32 by
    default)."""
    return alloc_tap_buffers_grouped(sel, n_chunks, n_heads, C, K, V, device, (), dtype)[0]


def alloc_tap_buffers_grouped(sel: TapSelection, n_chunks: int, n_heads: int, C: int, K: int, V: int,
                              device, group: tuple[str, ...], dtype=None):
    """As ``alloc_tap_buffers``, but the selected taps named in ``group`` are views of one flat tensor
    left unfilled, for the caller to NaN-fill before any kernel writes them. Returns ``(buffers, flat)``,
    ``flat`` None when no selected tap is in ``group``. The other buffers are views of a second flat
    tensor, NaN-filled here by one fill rather than one per tap (each launch is host time the GPU can
    wait on with taps on). Every view starts on a 256-byte boundary."""
    import torch

    dtype = torch.float32 if dtype is None else dtype
    views, totals = _grouped_layout(sel, n_chunks, n_heads, C, K, V, tuple(group), dtype.itemsize)
    filled = torch.full((totals[0],), float("nan"), dtype=dtype, device=device)
    flat = torch.empty(totals[1], dtype=dtype, device=device) if totals[2] else None
    parts = (filled, flat)
    bufs = {n: parts[part][off:off + size].view(shape) for n, part, off, size, shape in views}
    return bufs, flat


@functools.lru_cache(maxsize=64)
def _grouped_layout(sel: TapSelection, n_chunks: int, n_heads: int, C: int, K: int, V: int,
                    group: tuple[str, ...], itemsize: int):
    """Where each selected tap lies in ``alloc_tap_buffers_grouped``'s two flat tensors: ``(views, totals)``,
    ``views`` a tuple of ``(name, part, offset, numel, shape)`` (part 0: filled here, 1: left to the caller)
    and ``totals`` ``(elements of part 0, of part 1, whether any tap is in part 1)``. Plain integers, the
    same for every call of a shape: made once."""
    lo, hi = sel.chunk_range(n_chunks)
    nh = len(sel.head_list(n_heads))
    align = 256 // itemsize
    totals, views = [0, 0], []
    for n in sel.names:
        shape = (hi - lo, nh, *REGISTRY[n].dims(C, K, V))
        part, size = int(n in group), _numel(shape)
        views.append((n, part, totals[part], size, shape))
        totals[part] += -(-size // align) * align
    return tuple(views), (totals[0], totals[1], any(n in group for n in sel.names))
