"""Chunk numbering (spec §9): chunks never straddle sequences.

Sequence ``n`` (batch row ``n``, or the ``n``-th ``cu_seqlens`` segment) has ``ceil(len_n / C)``
chunks; global chunk ``c = sum_{m<n} ceil(len_m / C) + t``. Tokens are addressed on the
flattened axis ``B*T`` (batch row ``n`` starts at ``n*T``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdadbg_kernels.common import chunk_layout


@dataclass(frozen=True)
class ChunkTable:
    chunk_size: int
    seq_bos: torch.Tensor          # [N] first flattened token of each sequence
    seq_len: torch.Tensor          # [N]
    seq_chunk_base: torch.Tensor   # [N+1] global id of each sequence's first chunk
    seq: torch.Tensor              # [n_chunks] sequence of each chunk
    t: torch.Tensor                # [n_chunks] chunk position inside its sequence
    start: torch.Tensor            # [n_chunks] flattened token index of the chunk's row 0
    length: torch.Tensor           # [n_chunks] valid rows
    export_start: torch.Tensor     # [n_chunks] packed index (varlen) or index within the batch row

    @property
    def n_chunks(self) -> int:
        return int(self.seq.numel())

    @property
    def n_seqs(self) -> int:
        return int(self.seq_len.numel())

    @property
    def max_chunks(self) -> int:
        return int((self.seq_chunk_base[1:] - self.seq_chunk_base[:-1]).max().item()) if self.n_seqs else 0

    def token_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(idx, valid)`` of shape ``[n_chunks, C]``: flattened token of each chunk row, and
        whether the row is valid. Padding rows point at token 0 (mask them with ``valid``)."""
        rows = torch.arange(self.chunk_size)
        valid = rows[None, :] < self.length[:, None]
        idx = torch.where(valid, self.start[:, None] + rows[None, :], torch.zeros((), dtype=torch.long))
        return idx, valid


def chunk_table(B: int, T: int, cu_seqlens: torch.Tensor | None, chunk_size: int) -> ChunkTable:
    bos, lens, base, seq, t, start, length = chunk_layout(B, T, cu_seqlens, chunk_size)
    export_start = start if cu_seqlens is not None else t * chunk_size
    return ChunkTable(chunk_size, bos, lens, base, seq, t, start, length, export_start)
