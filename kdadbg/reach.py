"""Where NaN/Inf inputs can reach: the output and tap elements left out of a comparison on such a dump.

A NaN or Inf in an input (loaded with ``--allow-nonfinite``) makes the recurrence's own answer NaN/Inf
where the input reaches, in its sequence and head; a chunked algorithm spreads it further, to the other
tokens of the same chunk (their products multiply it by the causal mask's zeros: 0 · NaN = NaN), and where
it spreads depends on the implementation's chunking, not on its correctness. Comparing there blamed a correct
token-by-token implementation for the float64 reference's NaN before the NaN input (a user trial).
So on such a dump the elements a nonfinite input can reach in any chunking are left out of the comparison
on both sides (made NaN on both: "NaN/Inf on both sides", not compared), and everything else is compared
as always, where a NaN/Inf on one side fails: an implementation that makes a NaN where no input holds one
is still named.

The reach, per sequence and value head (a q/k head's input reaches the value heads reading it), in
``BLOCK``-token blocks of the sequence (or chunks, if longer), so that any chunking's spread is inside
(spec §1: the state ``S`` is written by ``k, v, g, beta`` and read by ``q``; its gradient ``dS`` is written
by ``q, do, dht`` and carried back through ``k, g, beta``):

- the state: from the block of the first nonfinite ``k, v, g, beta`` on (the whole sequence for ``h0``,
  ``A_log``, ``dt_bias``); ``o``, ``dq`` and every gradient reading the state (``dk, dg, dbeta``) there,
  ``ht`` where it is reached at all;
- the state's gradient: before the end of the block of the last nonfinite ``q`` or ``do`` (the whole
  sequence for ``k, g, beta, dht, A_log, dt_bias``, which it is carried back through); ``dk, dv, dg, dbeta``
  there, ``dh0`` where it is reached at all (``dv``, ``dh0`` read nothing else);
- the blocks of a nonfinite ``q`` (``o``, ``dq`` and the backward's products there) and ``do`` (``dq`` and
  the backward there);
- ``dA_log``, ``ddt_bias`` (sums over every sequence): the head where any gradient is reached.

A bound, not the exact set: an element inside it may well be finite on both sides; it is not compared.
(An adversarial trial: the first bound, the whole backward of any reached sequence and head, hid a
wrong ``o`` after a NaN ``q`` and a wrong ``dk`` before a NaN ``v``.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 64   # chunk sizes up to 64 that divide it (16, 32, 64) start their chunks on its boundaries


@dataclass
class Reach:
    """Token masks ``[B*T, HV]`` (flattened tokens, value heads) of what is reached, per quantity family."""

    o: torch.Tensor          # o and the forward taps
    dq: torch.Tensor
    dkgb: torch.Tensor       # dk, dg, dbeta
    dv: torch.Tensor
    ht: torch.Tensor         # [N, HV]
    dh0: torch.Tensor        # [N, HV]
    B: int
    T: int
    G: int                   # value heads per q/k head
    chunk_size: int

    def masks(self, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``{name: bool mask of the tensor's shape}`` for the outputs and gradients named (the reached
        elements), those with any reached only."""
        tokens = {"o": self.o, "dq": self.dq, "dk": self.dkgb, "dg": self.dkgb, "dbeta": self.dkgb, "dv": self.dv}
        bwd = self.dq.any(0) | self.dkgb.any(0) | self.dv.any(0) | self.dh0.any(0)
        out = {}
        for n, t in outputs.items():
            if n in ("ht", "dh0"):
                m = self.ht if n == "ht" else self.dh0
                m = m.reshape(*m.shape, *([1] * (t.ndim - 2)))
            elif n == "dA_log":
                m = bwd
            elif n == "ddt_bias":
                HV = bwd.shape[0]
                m = bwd[:, None].expand(HV, t.numel() // HV).reshape(t.shape)
            elif n in tokens and t.ndim >= 3:   # [B, T, heads, ...]
                tok = tokens[n]
                if t.shape[2] != tok.shape[1]:   # dq, dk: a q/k head, reached where a value head reading it is
                    tok = tok.reshape(tok.shape[0], -1, self.G).any(-1)
                m = tok.reshape(self.B, self.T, tok.shape[1], *([1] * (t.ndim - 3)))
            else:
                continue
            m = m.expand(t.shape).to(t.device)
            if bool(m.any()):
                out[n] = m
        return out

    def tap_masks(self, taps: dict[str, torch.Tensor], starts: list[int], lengths: list[int],
                  heads: list[int]) -> dict[str, torch.Tensor]:
        """The same for taps laid out ``[chunks, heads, ...]``: ``starts``, ``lengths`` each row's chunk's first
        flattened token and its valid rows, ``heads`` each column's value head. A chunk is reached where any of
        its tokens is, for the forward taps by ``o``'s reach, for the backward's by any gradient's."""
        from .compare.quantities import QUANTITIES

        h = torch.tensor(heads, dtype=torch.long)
        fwd_tok, bwd_tok = self.o, self.dq | self.dkgb | self.dv

        def per_chunk(tok):
            return torch.stack([tok[s:s + max(n, 1), h].any(0) for s, n in zip(starts, lengths)]) if starts else \
                torch.zeros(0, len(heads), dtype=torch.bool)

        fwd, bwd = per_chunk(fwd_tok), per_chunk(bwd_tok)
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

    def per_token(t: torch.Tensor | None, qk: bool = False) -> torch.Tensor:
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

    q, do = per_token(inputs.q, True), per_token(inputs.do)
    carried = per_token(inputs.k, True) | per_token(inputs.g) | per_token(inputs.beta)   # write S, carry dS
    v = per_token(inputs.v)
    heads = per_head(inputs.A_log) | per_head(inputs.dt_bias)
    h0, dht = per_seq(inputs.h0), per_seq(inputs.dht)
    if not bool(q.any() | do.any() | carried.any() | v.any() | heads.any() | h0.any() | dht.any()):
        return None
    block = max(BLOCK, config.chunk_size)
    z = lambda: torch.zeros(B * T, HV, dtype=torch.bool)   # noqa: E731
    state, grad, q_blocks, do_blocks = z(), z(), z(), z()
    for s in range(N):
        b, n = int(bos[s]), int(lens[s])
        blk = torch.arange(n) // block                      # each token's block in the sequence
        for h in range(HV):
            w = (carried[b:b + n, h] | v[b:b + n, h]).nonzero()
            if h0[s, h] or heads[h]:
                state[b:b + n, h] = True
            elif len(w):
                state[b:b + n, h] = blk >= blk[int(w[0])]
            up = (q[b:b + n, h] | do[b:b + n, h]).nonzero()
            if carried[b:b + n, h].any() or dht[s, h] or heads[h]:
                grad[b:b + n, h] = True
            elif len(up):
                grad[b:b + n, h] = blk <= blk[int(up[-1])]
            for mask, blocks in ((q[b:b + n, h], q_blocks), (do[b:b + n, h], do_blocks)):
                hit = blk[mask].unique()
                if len(hit):
                    blocks[b:b + n, h] = torch.isin(blk, hit)
    ht = torch.stack([state[int(bos[s]):int(bos[s]) + int(lens[s])].any(0) for s in range(N)])
    dh0 = torch.stack([grad[int(bos[s]):int(bos[s]) + int(lens[s])].any(0) for s in range(N)])
    return Reach(o=state | q_blocks, dq=state | q_blocks | do_blocks, dkgb=state | grad | q_blocks | do_blocks,
                 dv=grad | q_blocks | do_blocks, ht=ht, dh0=dh0, B=B, T=T, G=G, chunk_size=config.chunk_size)


def blank(tensors: dict[str, torch.Tensor], masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` with NaN where ``masks`` holds (new tensors; the originals untouched)."""
    return {n: torch.where(masks[n].to(t.device), torch.tensor(float("nan"), dtype=t.dtype, device=t.device), t)
            if n in masks else t for n, t in tensors.items()}


def reach_note(reach_counts: dict[str, int]) -> str:
    """The note saying what the reach left out."""
    what = ", ".join(f"{n}: {c}" for n, c in reach_counts.items())
    return (f"left out as NaN/Inf inputs can reach them, in any chunking ({what} elements; {BLOCK}-token blocks: "
            f"the state from the block of the first NaN/Inf k, v, g, beta on, its gradient before the block of the "
            f"last NaN/Inf q, do (all of it for k, g, beta, dht), and those blocks; README, kdadbg/reach.py): there a chunked algorithm's NaN "
            f"spreads to the other tokens of its chunk (0 x NaN) as its chunking, not its correctness, decides. "
            f"Everything else is compared, a NaN/Inf on one side failing")
