"""Everything ``diff`` compares per chunk × head, in one registry: the taps (``kernels/taps.py``) and
the implementation's outputs and gradients cut into per-chunk rows.

Row quantities, so that an implementation with no taps at all is still localised to chunk and head:

=========================  ==========  ==========================================================
name                       per cell    where it sits in dataflow order
=========================  ==========  ==========================================================
``o``                      ``[C,V]``   the chunk's output rows, after ``U`` of the chunk
``ht``                     ``[K,V]``   final state of a sequence, at its last chunk, after ``o``
``dh0``                    ``[K,V]``   gradient of a sequence's h0, at its first chunk, after ``dS``
``dv dq dk dbeta dg``      token rows  the chunk's gradient rows, after ``dgc`` of the chunk
``dA_log ddt_bias``        ``[]/[K]``  per head, over every chunk: last of all
=========================  ==========  ==========================================================

States are compared in the math layout ``[K,V]`` (converted from the dump's layout). Cells are per
value head, except ``dq`` and ``dk`` (``QK_ROWS``) under GVA: those are per q/k head, the gradient
summed over the group of value heads that read it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdadbg_kernels.taps import REGISTRY as TAP_REGISTRY
from kdadbg_kernels.taps import Tap
from kdadbg_kernels.taps import STAGES, TAP_NAMES

KINDS = ("tap", "row", "seq", "head")   # per chunk (tap, row), per sequence, per head


@dataclass(frozen=True)
class Quantity(Tap):
    """A tap, or an output row (``kind`` row, seq or head): the registry's fields, dims and row axes."""

    kind: str = "tap"

    @property
    def is_tap(self) -> bool:
        return self.kind == "tap"


ROWS: tuple[Quantity, ...] = (
    Quantity("o", "fwd_recurrence", ("C", "V"), "output o of the chunk's tokens", "row"),
    Quantity("ht", "fwd_recurrence", ("K", "V"), "final state of the sequence (at its last chunk)", "seq"),
    Quantity("dh0", "bwd_recurrence", ("K", "V"), "gradient of the sequence's h0 (at its first chunk)", "seq"),
    Quantity("dv", "bwd_prepare", ("C", "V"), "dv of the chunk's tokens", "row"),
    Quantity("dq", "bwd_prepare", ("C", "K"), "dq of the chunk's tokens", "row"),
    Quantity("dk", "bwd_prepare", ("C", "K"), "dk of the chunk's tokens", "row"),
    Quantity("dbeta", "bwd_prepare", ("C",), "dbeta of the chunk's tokens", "row"),
    Quantity("dg", "bwd_prepare", ("C", "K"), "dg of the chunk's tokens", "row"),
    Quantity("dA_log", "bwd_prepare", (), "dA_log of the head (every chunk contributes)", "head"),
    Quantity("ddt_bias", "bwd_prepare", ("K",), "ddt_bias of the head (every chunk contributes)", "head"),
)
ROW_NAMES = tuple(q.name for q in ROWS)
QK_ROWS = ("dq", "dk")   # per q/k head (GVA: each shared by a group of value heads)

QUANTITIES: dict[str, Quantity] = {
    **{t.name: Quantity(t.name, t.stage, t.shape, t.meaning) for t in TAP_REGISTRY.values()},
    **{q.name: q for q in ROWS},
}

# Order within one chunk of each stage (the gradient a chunk passes back, dS, last of its taps).
_BWD_REC = tuple(n for n in TAP_NAMES if TAP_REGISTRY[n].stage == "bwd_recurrence" and n != "dS") + ("dS",)
TAP_ORDER: tuple[str, ...] = tuple(n for n in TAP_NAMES if TAP_REGISTRY[n].stage.startswith("fwd")) + _BWD_REC + \
    tuple(n for n in TAP_NAMES if TAP_REGISTRY[n].stage == "bwd_prepare")
ORDER: tuple[str, ...] = (*TAP_ORDER[:13], "o", "ht", *TAP_ORDER[13:24], "dh0", *TAP_ORDER[24:],
                          "dv", "dq", "dk", "dbeta", "dg", "dA_log", "ddt_bias")
_RANK = {n: i for i, n in enumerate(ORDER)}
assert set(ORDER) == set(QUANTITIES) and len(ORDER) == len(QUANTITIES)


@dataclass(frozen=True)
class ChunkInfo:
    """Per global chunk id: sequence, position in it, first token (as a taps file's ``chunk.start``:
    the packed index for varlen, the index within the batch row otherwise) and valid rows."""

    chunk_size: int
    seq: dict[int, int]
    t: dict[int, int]
    start: dict[int, int]
    length: dict[int, int]

    @staticmethod
    def from_table(ct) -> "ChunkInfo":
        ids = range(ct.n_chunks)
        return ChunkInfo(ct.chunk_size, {c: int(ct.seq[c]) for c in ids}, {c: int(ct.t[c]) for c in ids},
                         {c: int(ct.export_start[c]) for c in ids}, {c: int(ct.length[c]) for c in ids})

    @staticmethod
    def from_file(f: dict, chunk_size: int) -> "ChunkInfo":
        ch = f["chunks"]
        ids = [int(i) for i in ch["index"]]
        seq = dict(zip(ids, (int(s) for s in ch["seq"])))
        t = {}
        seen: dict[int, int] = {}
        for c in sorted(ids):  # position among the file's chunks of that sequence (exact if it starts there)
            t[c] = seen.get(seq[c], 0)
            seen[seq[c]] = t[c] + 1
        return ChunkInfo(chunk_size, seq, t, dict(zip(ids, (int(s) for s in ch["start"]))),
                         dict(zip(ids, (int(s) for s in ch["len"]))))

    def seq_chunks(self, n: int) -> list[int]:
        return sorted(c for c, s in self.seq.items() if s == n)


def dataflow_key(name: str, chunk: int | None, info: ChunkInfo) -> tuple:
    """Sort key of a (quantity, chunk) cell in dataflow order, the order the work happens in: the forward
    sequence by sequence, first chunk to last, each chunk's prepare then its recurrence; then the backward
    sequence by sequence, last chunk to first (the walk the state gradient takes), each chunk's recurrence
    then its prepare (which reads the state gradient arriving there); per-head gradients last. A chunk's
    cells are thus after every cell they depend on, and an error carried back through the state shows
    first at the chunk it entered, also where only the gradients' rows are compared (no taps)."""
    q = QUANTITIES[name]
    s = STAGES.index(q.stage)
    if q.kind == "head" or chunk is None:
        return (2, 0, 0, 0, _RANK[name])
    if q.stage.startswith("fwd"):
        return (0, info.seq[chunk], chunk, s, _RANK[name])
    return (1, info.seq[chunk], -chunk, s, _RANK[name])


# [C, C] taps that are triangular by construction: the diagonal offset of their meaningful part (``tril``
# with it); above it both sides hold the same structural zeros (INV: with its unit diagonal), which compare
# nothing about the chunk
MEANINGFUL_TRIL = {"L": -1, "INV": -1, "Mqk": 0, "dMqk": 0, "dL": -1}


def meaningful_mask(name: str, lengths: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor | None:
    """``[R, 1, C, C]`` bool: the elements of a triangular tap (``MEANINGFUL_TRIL``) inside each chunk's valid
    rows and on or below its meaningful diagonal; None for any other quantity."""
    if name not in MEANINGFUL_TRIL:
        return None
    tri = torch.ones(dims, dtype=torch.bool).tril(MEANINGFUL_TRIL[name])
    return valid_mask(name, lengths, dims) & tri


def valid_mask(name: str, lengths: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``[R, 1, *dims]`` bool: the elements of ``name`` inside each chunk's valid rows."""
    R = lengths.numel()
    m = torch.ones((R, 1, *dims), dtype=torch.bool)
    for axis in QUANTITIES[name].row_dims:
        rows = torch.arange(dims[axis])
        shape = [1] * (2 + len(dims))
        shape[0], shape[2 + axis] = R, dims[axis]
        m = m & (rows[None, :] < lengths[:, None]).reshape(shape)
    return m
