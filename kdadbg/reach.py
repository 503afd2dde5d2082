"""Where NaN/Inf inputs can reach: the output and tap elements left out of a comparison on such a dump.

A NaN or Inf in an input (loaded with ``--allow-nonfinite``) makes the recurrence's own answer NaN/Inf
from its token on, in its sequence and head; a chunked algorithm spreads it further, to the earlier tokens
of the same chunk (their products multiply it by the causal mask's zeros: 0 · NaN = NaN), and where it
spreads depends on the implementation's chunking, not on its correctness. Comparing there blamed a correct
token-by-token implementation for the float64 reference's NaN before the NaN input (user trial, round 41).
So on such a dump the elements a nonfinite input can reach in any chunking are left out of the comparison
on both sides (made NaN on both: "NaN/Inf on both sides", not compared), and everything else is compared
as always, where a NaN/Inf on one side fails: an implementation that makes a NaN where no input holds one
is still named.

The reach, per sequence and value head (a q/k head's input reaches the value heads reading it):

- forward (``o``, ``ht`` and the forward taps): from the start of the ``BLOCK``-token block of the
  sequence (or the chunk, if longer) holding the first token with a nonfinite ``q, k, v, g, beta``, on;
  the whole sequence where ``h0``, ``A_log`` or ``dt_bias`` is nonfinite for that head;
- backward (every gradient and backward tap): the whole sequence where the forward is reached anywhere in it
  or ``do`` or ``dht`` holds a NaN/Inf (each gradient reads the state from both directions), except ``dv``
  and ``dh0``, which read the state's gradient alone (spec §1.3: not ``v`` nor ``h0``): for them a NaN/Inf
  ``v`` or ``h0`` is not counted; ``dA_log``, ``ddt_bias`` (sums over every sequence): the head where any
  sequence's backward is reached.

A bound, not the exact set: an element inside it may well be finite on both sides; it is not compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

BLOCK = 64   # chunk sizes up to 64 that divide it (16, 32, 64) start their chunks on its boundaries


@dataclass
class Reach:
    fwd_from: torch.Tensor   # [N, HV] the first token (within the sequence) the forward reach starts at; inf: none
    bwd: torch.Tensor        # [N, HV] bool: the sequence's backward is reached
    bwd_dS: torch.Tensor     # [N, HV] bool: its state gradient is (dv, dh0 read nothing else)
    seq_bos: torch.Tensor    # [N] the sequence's first flattened token
    seq_len: torch.Tensor    # [N]
    B: int
    T: int
    G: int                   # value heads per q/k head
    chunk_size: int

    def _tokens(self, per_seq: torch.Tensor) -> torch.Tensor:
        """[B*T, HV] from a per-sequence [N, HV] start offset: token offset >= start within the sequence."""
        HV = per_seq.shape[1]
        out = torch.zeros(self.B * self.T, HV, dtype=torch.bool)
        for s in range(len(self.seq_bos)):
            bos, n = int(self.seq_bos[s]), int(self.seq_len[s])
            off = torch.arange(n, dtype=torch.float64)[:, None]
            out[bos:bos + n] = off >= per_seq[s][None, :]
        return out

    def masks(self, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{name: bool mask of the tensor's shape}`` for the outputs and gradients named (the reached
        elements), those with any reached only."""
        fwd_tok = self._tokens(self.fwd_from)
        bwd_tok = self._tokens(torch.where(self.bwd, 0.0, math.inf))
        dS_tok = self._tokens(torch.where(self.bwd_dS, 0.0, math.inf))
        out = {}
        for n, t in outputs.items():
            if n in ("ht", "dh0"):
                m = (self.fwd_from < math.inf) if n == "ht" else self.bwd_dS
                m = m.reshape(*m.shape, *([1] * (t.ndim - 2)))
            elif n == "dA_log":
                m = self.bwd.any(0)
            elif n == "ddt_bias":
                HV = self.bwd.shape[1]
                m = self.bwd.any(0)[:, None].expand(HV, t.numel() // HV).reshape(t.shape)
            elif t.ndim >= 3:   # [B, T, heads, ...]
                tok = fwd_tok if n == "o" else dS_tok if n == "dv" else bwd_tok
                if t.shape[2] != tok.shape[1]:   # dq, dk: a q/k head, reached where a value head reading it is
                    tok = tok.reshape(tok.shape[0], -1, self.G).any(-1)
                m = tok.reshape(self.B, self.T, tok.shape[1], *([1] * (t.ndim - 3)))
            else:
                continue
            m = m.expand(t.shape).to(t.device)
            if bool(m.any()):
                out[n] = m
        return out

    def tap_masks(self, taps: dict[str, torch.Tensor], seq_of: list[int], t_of: list[int],
                  heads: list[int]) -> dict[str, torch.Tensor]:
        """The same for taps laid out ``[chunks, heads, ...]``: ``seq_of``, ``t_of`` the sequence and position
        in it of each row's chunk, ``heads`` each column's value head."""
        from .compare.quantities import QUANTITIES

        C = self.chunk_size
        seq = torch.tensor(seq_of, dtype=torch.long)
        h = torch.tensor(heads, dtype=torch.long)
        first_tok = torch.tensor(t_of, dtype=torch.float64) * C
        fwd = (first_tok[:, None] + C > self.fwd_from[seq][:, h])     # the chunk overlaps the reach or follows it
        bwd = self.bwd[seq][:, h]
        out = {}
        for n, t in taps.items():
            m = fwd if QUANTITIES[n].stage.startswith("fwd") else bwd
            m = m.reshape(*m.shape, *([1] * (t.ndim - 2))).expand(t.shape).to(t.device)
            if bool(m.any()):
                out[n] = m
        return out


def nonfinite_reach(inputs, config, ct) -> Reach | None:
    """The :class:`Reach` of a dump's NaN/Inf inputs, or None where every input is finite."""
    B, T, H, K, V = inputs.shape
    HV = inputs.HV
    G = HV // H
    N = int(ct.n_seqs)
    bos, lens = ct.seq_bos.cpu(), ct.seq_len.cpu()

    def per_token(t: torch.Tensor | None, qk: bool) -> torch.Tensor:
        if t is None:
            return torch.zeros(B * T, HV, dtype=torch.bool)
        bad = ~torch.isfinite(t.detach().cpu())
        bad = bad.reshape(B * T, t.shape[2], -1).any(-1) if t.ndim > 3 else bad.reshape(B * T, t.shape[2])
        return bad.repeat_interleave(G, dim=1) if qk else bad

    def per_seq(t: torch.Tensor | None) -> torch.Tensor:
        if t is None:
            return torch.zeros(N, HV, dtype=torch.bool)
        return (~torch.isfinite(t.detach().cpu())).reshape(N, HV, -1).any(-1)

    def per_head(t: torch.Tensor | None) -> torch.Tensor:
        if t is None:
            return torch.zeros(HV, dtype=torch.bool)
        return (~torch.isfinite(t.detach().cpu())).reshape(HV, -1).any(-1)

    # the inputs the state's gradient reads (spec §1.3: dS_{t-1} from dS_t through k, g, beta; q and do
    # write it), and v, h0, which only the state reads
    dS_tok = per_token(inputs.q, True) | per_token(inputs.k, True) | per_token(inputs.g, False) \
        | per_token(inputs.beta, False)
    state_tok = per_token(inputs.v, False)
    do_tok = per_token(inputs.do, False)
    heads = (per_head(inputs.A_log) | per_head(inputs.dt_bias))[None, :]
    h0 = per_seq(inputs.h0)
    dht = per_seq(inputs.dht)
    if not bool(dS_tok.any() | state_tok.any() | do_tok.any() | heads.any() | h0.any() | dht.any()):
        return None
    block = max(BLOCK, config.chunk_size)
    fwd_from = torch.full((N, HV), math.inf, dtype=torch.float64)
    bwd_dS = torch.zeros(N, HV, dtype=torch.bool)
    for s in range(N):
        b, n = int(bos[s]), int(lens[s])
        bad = dS_tok[b:b + n] | state_tok[b:b + n]
        for h in range(HV):
            hit = bad[:, h].nonzero()
            if len(hit):
                fwd_from[s, h] = (int(hit[0]) // block) * block
        bwd_dS[s] = (do_tok[b:b + n] | dS_tok[b:b + n]).any(0)
    fwd_from = torch.where(h0 | heads, 0.0, fwd_from)
    bwd_dS = bwd_dS | dht | heads
    bwd = bwd_dS | (fwd_from < math.inf)
    return Reach(fwd_from, bwd, bwd_dS, bos, lens, B, T, G, config.chunk_size)


def blank(tensors: dict[str, torch.Tensor], masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` with NaN where ``masks`` holds (new tensors; the originals untouched)."""
    return {n: torch.where(masks[n].to(t.device), torch.tensor(float("nan"), dtype=t.dtype, device=t.device), t)
            if n in masks else t for n, t in tensors.items()}


def reach_note(reach_counts: dict[str, int]) -> str:
    """The note saying what the reach left out."""
    what = ", ".join(f"{n}: {c}" for n, c in reach_counts.items())
    return (f"left out as NaN/Inf inputs can reach them, in any chunking ({what} elements): each sequence and "
            f"head from the {BLOCK}-token block holding its first NaN/Inf input on in the forward, and its whole "
            f"backward; there a chunked algorithm's NaN spreads to earlier tokens of its chunk (0 x NaN) as its "
            f"chunking, not its correctness, decides. Everything else is compared, a NaN/Inf on one side failing")
