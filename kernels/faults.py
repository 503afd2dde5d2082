"""Test-only fault hook: plant one known bug in one chunk, to prove ``kdadbg diff`` finds it.

``plant(name, chunk)`` is a context manager. While it is active, the kernel launches that implement
the fault get a constexpr ``FAULT`` id (0 otherwise: the fault code compiles out) and the chunk it
applies to. Like a real bug, a planted fault follows the chunk's data: the first kernel call after
``plant`` records the planted chunk's first token (its raw ``q`` row); later calls (``diff``'s window
rerun on a slice of the sequence) apply the fault to the chunk that starts with that token, or to none.

=================  ===  =========================================================  ==================
name               id   what the kernel does wrong in the planted chunk            first bad tap
=================  ===  =========================================================  ==================
dL_sign            1    ``dL`` with the wrong sign                                 dL
dS_untransposed    2    ``dS`` passed on transposed (needs K == V)                 dS
gate_padding       3    padding rows' decay not masked, gT = the tile's last row   gT
dgT_after_update   4    ``dgT`` reads ``dS`` after the update (not the chunk's     dgT
                        first of its sequence)
ln2_twice          5    ln 2 applied to the gate gradient a second time            dgc
varlen_offset      6    loads shifted one token, from that chunk on                gc
=================  ===  =========================================================  ==================
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

FAULTS = {"dL_sign": 1, "dS_untransposed": 2, "gate_padding": 3, "dgT_after_update": 4, "ln2_twice": 5,
          "varlen_offset": 6}

_planted: dict | None = None
_chunk = -1


@contextmanager
def plant(name: str, chunk: int):
    """Plant fault ``name`` at global chunk ``chunk`` of the next run (and of any rerun on its data)."""
    global _planted, _chunk
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    _planted, _chunk = {"name": name, "chunk": chunk, "key": None}, -1
    try:
        yield
    finally:
        _planted, _chunk = None, -1


def bind(q: torch.Tensor, chunk_start: torch.Tensor) -> None:
    """Resolve the planted chunk in the run about to launch (``q`` [BT,H,K] raw, ``chunk_start`` [NC])."""
    global _chunk
    if _planted is None:
        return
    starts = chunk_start.detach().to("cpu", torch.long)
    rows = q.detach().to("cpu")[starts]
    if _planted["key"] is None:
        c = _planted["chunk"]
        _planted["key"] = rows[c].clone() if 0 <= c < len(starts) else None
        _chunk = c if _planted["key"] is not None else -1
        return
    hits = [c for c in range(len(starts)) if torch.equal(rows[c], _planted["key"])]
    _chunk = hits[0] if hits else -1


def args(*names: str) -> tuple[int, int]:
    """``(FAULT, fault_chunk)`` for a launch implementing ``names``: ``(0, -1)`` unless one is planted."""
    if _planted is None or _planted["name"] not in names or _chunk < 0:
        return 0, -1
    return FAULTS[_planted["name"]], _chunk
