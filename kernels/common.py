"""Shared host-side structures of the kernels: the device chunk table, the forward's saved
tensors (the contract between the forward and the backward stages) and the tap plan."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import torch

from .taps import REGISTRY, TapSelection, alloc_tap_buffers_grouped
from .tuning import KnobError, knob

PRECISIONS = ("fp32", "bf16")

# Launch options of every kernel. No fused multiply-add contraction: with fusion on, the compiler
# may contract a product differently when a tap also stores it, and outputs with taps on would not
# be the same bits as with taps off.
LAUNCH = dict(enable_fp_fusion=False)


def dot_mode(precision: str) -> int:
    """The backward kernels' ``DOT``: 0 exact fp32 products; 1 bf16 MMA operands (``precision="bf16"``
    on the GPU); 2 the same emulated under the interpreter (``tlmath.mm``)."""
    if precision == "fp32":
        return 0
    return 2 if os.environ.get("TRITON_INTERPRET") == "1" else 1


def state_f64(precision: str) -> int:
    """Whether the state passes carry the state in float64 (knob ``STATE_F64``, default in fp32 mode), stored
    in fp32: the forward's ``S`` and ``U`` with float64 products, the backward's ``dS`` added in float64 from
    fp32 products (Triton 3.6 did not lower float64 products there on sm_90). On the H200 the fp32 states
    ran at about twice the float32 reference's error, and a ``dg`` row whose chunk cancels carried it to 5-9
    times its floor (chunks 177 and 448 of the model-size ``kimi`` case, ``benchmarks/dg_probe.py``: started
    from the reference's states the same rows sat at their floor). bf16 mode: no effect."""
    return int(precision == "fp32" and bool(knob("STATE_F64", 1)))


def rowscale_mode(rs: bool, qk_lowp: int) -> int:
    """The ``RS`` flag of the kernels that read ``qn, kn`` (``tlmath.load_qk``): 0 when they are stored,
    else ``1 + qk_lowp`` (the row scales ``prepare.qk_rowscale``,
    ``prepare.rowscale_for_inference``, and the rounding the token kernel applies, ``prepare.qk_lowp_mode``)."""
    return 1 + qk_lowp if rs else 0


def fwd_lowp(precision: str) -> int:
    """Which of the forward state pass's inputs are bf16 in the fast mode (knob ``FWD_LOWP``, a bit mask):
    1 ``w``, 2 ``krT``, 4 ``u`` stored in bf16; 8 the state pass's two products as bf16 MMAs (``mm``)
    instead of tf32. None in fp32 mode. The default 11 keeps ``u`` in fp32: with it in bf16 too (15),
    the realistic ``kimi_varlen`` dump's ``dA_log`` was 1.09e-2 from float64 (over its 1e-2 bar), 6.8e-3
    with ``u`` in fp32 (docs/kernels.md, "bf16 operands")."""
    lowp = knob("FWD_LOWP", 11) if precision == "bf16" else 0
    if lowp & ~15:
        raise KnobError(f"KDADBG_FWD_LOWP={lowp}: expected a mask of the bits 1, 2, 4 and 8")
    return lowp


def udu_bf16(precision: str) -> bool:
    """Whether the forward's ``U`` and the backward's completed ``dU`` [BT, H, V] are stored in bf16 (knob
    ``UDU_BF16``, bf16 mode, default on). Their one reader, the backward V pass, uses them only as bf16 MMA
    operands, rounded to nearest even (``dO U^T``, ``dvcorr U^T``, ``U dS⁺^T``; ``INV^T dU``), so storing the
    rounded values keeps every bit (``MQK_BF16``'s reasoning) and halves the bytes the state passes write
    and the V pass reads, in each of its K blocks. The state passes keep U and dU in fp32 in their
    registers (``o``, the next state and ``dS`` use those); their taps are then stored from there, in fp32
    (``TapPlan.own``): the forward state pass stores the U tap and the backward state pass the dU tap."""
    return precision == "bf16" and bool(knob("UDU_BF16", 1))


def s_bf16(precision: str) -> bool:
    """Whether the forward's per-chunk states ``S`` [NC, H, K, V] are stored in bf16 (knob ``S_BF16``, bf16
    mode, default on), rounded to nearest even, as fla stores its ``h``. On an H100 at lower-bound H32 T16384
    (one process, ``docs/gpu/round55/call3``) the forward's state pass took 0.598 -> 0.502 ms and the forward
    2.024 -> 1.922 ms of kernel time. At K = V = 128 and chunk 64 they are
    8 bytes per element of a [BT, H, K] tensor in fp32, more than any other tensor the forward writes. Their
    readers: the backward V pass's ``dO S^T`` and ``dvcorr S^T`` (bf16 MMA operands: the same bits either
    way) and its ``dgTs = rowsum_v(dS⁺ ⊙ S)``, which reads the rounded values: ``dg``, ``dA_log`` and
    ``ddt_bias`` move, by a rounding of ``S`` (2^-9 relative) in one of the terms of ``dgT``. The state pass
    keeps ``S`` in fp32 in its registers (the next state, ``U`` and ``o`` use that), and stores the S tap
    from there, in fp32 (``TapPlan.own``)."""
    return precision == "bf16" and bool(knob("S_BF16", 1))


def to_device(host: torch.Tensor, device) -> torch.Tensor:
    """``host`` on ``device`` without waiting for the GPU: on CUDA from pinned memory (a pageable copy makes
    the host wait for the GPU's queued work, which left the host the bound of a taps-on call)."""
    if torch.device(device).type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def chunk_layout(B: int, T: int, cu_seqlens: torch.Tensor | None, chunk_size: int):
    """The chunk numbering of spec §9, as CPU int64 tensors.

    Returns ``(seq_bos [N], seq_len [N], seq_chunk_base [N+1], seq [NC], t [NC], start [NC],
    length [NC])``: chunks never straddle sequences; sequence n has ceil(len_n / C) chunks; global
    chunk ``c = seq_chunk_base[n] + t``; ``start`` is the flattened (``B*T``) token of row 0.
    """
    C = chunk_size
    if cu_seqlens is None:
        bos = torch.arange(B, dtype=torch.long) * T
        lens = torch.full((B,), T, dtype=torch.long)
    else:
        cu = cu_seqlens.detach().to("cpu", torch.long)
        bos, lens = cu[:-1].clone(), cu[1:] - cu[:-1]
    n_per = (lens + C - 1) // C
    base = torch.zeros(len(lens) + 1, dtype=torch.long)
    base[1:] = torch.cumsum(n_per, 0)
    seq = torch.repeat_interleave(torch.arange(len(lens)), n_per)
    t = torch.arange(int(base[-1])) - base[seq]
    start = bos[seq] + t * C
    length = torch.minimum(lens[seq] - t * C, torch.tensor(C))
    return bos, lens, base, seq, t, start, length


@dataclass(frozen=True)
class KernelChunks:
    """Chunk table on the device (int32). Tokens live on the flattened axis ``B*T``.

    chunk_start[c]: flattened token of row 0 of chunk c; chunk_len[c]: valid rows;
    chunk_seq[c]: its sequence; seq_chunk_base[n]: first global chunk of sequence n
    (``seq_chunk_base[N]`` = n_chunks); seq_order: the sequences, most chunks first (the state passes
    launch their programs in that order: ``state_grid``).
    """

    chunk_size: int
    chunk_start: torch.Tensor
    chunk_len: torch.Tensor
    chunk_seq: torch.Tensor
    seq_chunk_base: torch.Tensor
    n_chunks: int
    n_seqs: int
    max_chunks: int
    seq_order: torch.Tensor

    @staticmethod
    def build(B: int, T: int, cu_seqlens: torch.Tensor | None, chunk_size: int, device) -> "KernelChunks":
        """The table for ``B`` sequences of ``T`` tokens, or for the varlen offsets ``cu_seqlens``
        (pass a CPU copy when there is one: a device tensor is read back, which waits for the GPU)."""
        if cu_seqlens is None:
            return _dense_chunks(B, T, chunk_size, torch.device(device))
        bos, lens, base, seq, t, start, length = chunk_layout(B, T, cu_seqlens, chunk_size)
        NC, N = int(base[-1]), len(lens)
        # one host-to-device copy of the whole table
        n_per = (lens + chunk_size - 1) // chunk_size
        order = torch.sort(-n_per.to(torch.int64), stable=True).indices
        table = torch.cat([start, length, seq, base, order]).to(torch.int32)
        table = to_device(table, device)
        start, length, seq, base, order = torch.split(table, [NC, NC, NC, N + 1, N])
        return KernelChunks(chunk_size, start, length, seq, base, NC, N, int(n_per.max()) if N else 0, order)


@functools.lru_cache(maxsize=32)
def _dense_chunks(B: int, T: int, C: int, device: torch.device) -> KernelChunks:
    """The dense table, built on the device (a host-to-device copy would sync) once per shape: the
    kernels only read it, and rebuilding it cost a dozen small launches per call."""
    n_per = (T + C - 1) // C
    c = torch.arange(B * n_per, device=device, dtype=torch.int64)
    t = c % n_per
    i32 = dict(dtype=torch.int32)
    return KernelChunks(C, ((c // n_per) * T + t * C).to(**i32).contiguous(),
                        torch.clamp(T - t * C, max=C).to(**i32).contiguous(), (c // n_per).to(**i32).contiguous(),
                        (torch.arange(B + 1, device=device, dtype=torch.int64) * n_per).to(**i32).contiguous(),
                        B * n_per, B, n_per if B else 0, torch.arange(B, device=device, dtype=torch.int32))


def state_grid(chunks: KernelChunks, H: int, n_vb: int) -> tuple[int, int, int]:
    """Grid of a state pass, one program per (V block, head, sequence), the sequence axis slowest:
    programs start in launch order, so with ``chunks.seq_order`` (most chunks first) the longest chains
    start in the first wave instead of waiting behind short ones (``STATE_LONGEST_FIRST``)."""
    return (n_vb, H, chunks.n_seqs)


def seq_order(chunks: KernelChunks) -> torch.Tensor:
    """The sequence of each program along ``state_grid``'s last axis: ``chunks.seq_order``, or with
    ``KDADBG_STATE_LONGEST_FIRST=0`` (for A/B timing) the sequences as given."""
    if knob("STATE_LONGEST_FIRST", 1):
        return chunks.seq_order
    return torch.arange(chunks.n_seqs, device=chunks.seq_order.device, dtype=torch.int32)


@dataclass
class FwdSaved:
    """What the forward keeps for the backward (float32, gates natural-log, math layout).

    qn, kn: [BT,H,K] after l2norm, fp32 (fp16 in bf16 mode: prepare.qk_lowp_mode), or the raw q, k themselves in their
    own dtype: without l2norm, and with the l2norm's row scales rq, rk [BT,H] fp32 (fp32 mode:
    prepare.qk_rowscale, qn = q * rq); gc: [BT,H,K] within-chunk inclusive cumsum of the activated gate; gT: [NC,H,K]; b: [BT,H]
    after activation; INV, Mqk: [NC,H,C,C] (padding rows/cols: INV identity, Mqk 0); S: [NC,H,K,V] state
    entering each chunk (bf16 in bf16 mode: ``s_bf16``); U: [BT,H,V] (bf16 in bf16 mode: ``udu_bf16``). qd and w [BT,H,K]: the forward's
    operands of the state pass, kept for the backward's (``chunk.bwd_fwd_operands``), else None.
    """

    qn: torch.Tensor
    kn: torch.Tensor
    gc: torch.Tensor
    gT: torch.Tensor
    b: torch.Tensor
    INV: torch.Tensor
    Mqk: torch.Tensor
    S: torch.Tensor
    U: torch.Tensor
    rq: torch.Tensor | None = None
    rk: torch.Tensor | None = None
    qd: torch.Tensor | None = None
    w: torch.Tensor | None = None


# The taps of the backward's per-chunk passes and finish kernel (prepare_bwd.DQKG_TAPS and db), all written
# after the backward state pass: their buffers, one flat tensor, are NaN-filled by that pass's programs, a
# few blocks a chain step (recurrence_bwd_kernel's FILL), instead of by a fill of their own. Not dU, which
# that pass stores itself (its buffer is filled before it runs)
STATE_FILL_TAPS = ("dvcorr", "dMqk", "dL", "dkr", "dqd", "dkd", "dki", "dgT", "dgc", "db")

# Taps that are tensors the kernels write whether taps are on or off: the forward's saved tensors and the
# backward's intermediates, with the layout of each (``token``: [BT, H, *d]; ``chunk``: [NC, H, *shape];
# ``state``: dS, read from dSn [NC, H, K, V], the gradient arriving at each chunk, and dh0 [N, H, K, V]).
# With knob TAPS_ALIAS (default 1) no kernel stores them a second time: the stage NaN-fills its tensor
# over the tap window before its kernel writes it (``TapPlan.alias``), and ``TapPlan.buffers`` reads the
# taps from there.
ALIAS_TAPS = {"gc": "token", "gT": "chunk", "b": "token", "INV": "chunk", "Mqk": "chunk", "S": "chunk",
              "U": "token", "dS": "state", "dU": "token", "dMqk": "chunk", "dL": "chunk", "dkr": "token"}


@dataclass(frozen=True)
class TapWindow:
    """The tap window's chunks on the host: first token, valid rows, sequence, whether each is its
    sequence's first chunk; ``dense``: every chunk full and right after the previous one (token-major
    rows then lie as the registry's chunk rows)."""

    start: torch.Tensor   # [hi-lo] int64
    length: torch.Tensor  # [hi-lo] int64
    seq: torch.Tensor     # [hi-lo] int64
    first: torch.Tensor   # [hi-lo] bool
    any_first: bool
    dense: bool
    span: tuple[int, int] = (0, 0)  # flattened tokens [t0, t1) of the window's rows

    @staticmethod
    def of(lo: int, hi: int, C: int, start, length, seq, t) -> "TapWindow":
        """From the per-chunk tables of ``chunk_layout`` (``start, length, seq, t``, any device)."""
        start, length, seq, t = (x[lo:hi].to("cpu", torch.int64) for x in (start, length, seq, t))
        n = start.numel()
        if n == 0:
            return TapWindow(start, length, seq, t == 0, False, False)
        first = t == 0
        s0, s1, l1 = start[0].item(), start[-1].item(), length[-1].item()
        # chunks lie in token order without overlapping, so full chunks whose first and last start n - 1
        # chunks apart are C rows apart each: the window's rows are then the tokens [s0, s0 + n C)
        dense = s1 == s0 + C * (n - 1) and bool((length == C).all())
        return TapWindow(start, length, seq, first, bool(first.any()), dense, (s0, s1 + l1))

    def token_span(self) -> tuple[int, int]:
        """Flattened tokens ``[t0, t1)`` of the window's rows (chunks are in token order)."""
        return self.span


@dataclass
class TapPlan:
    """Where taps go: buffers ``[hi-lo, n_sel_heads, *shape]`` and, per head, its slot or -1.

    Every buffer starts NaN-filled before a kernel writes it. Those of ``STATE_FILL_TAPS`` are views of
    one flat tensor (``unfilled``) that the backward fills (knob ``TAPS_FILL_STATE``, default 1; 0 fills
    them here): kernels take buffers with ``get``; ``buffers``, for readers, fills them first if no
    backward has. The taps in ``aliased`` (``ALIAS_TAPS``) have no buffer of their own: ``buffers`` reads
    them from the kernels' tensors, NaN-filled over the window before the kernels wrote them.
    """

    selection: TapSelection
    lo: int
    hi: int
    head_slot: torch.Tensor  # [H] int32
    _buffers: dict[str, torch.Tensor]
    n_sel: int = 0
    unfilled: torch.Tensor | None = None  # flat fp32 holding the STATE_FILL_TAPS buffers, not yet NaN
    aliased: tuple[str, ...] = ()
    shape: tuple[int, int, int, int] = (0, 0, 0, 0)  # H, C, K, V
    window: TapWindow | None = None
    _sources: dict = field(default_factory=dict)  # aliased tap -> the kernels' tensor(s) holding it
    _read: dict | None = None
    _tables: dict = field(default_factory=dict)  # the window's index tables on the device (_dev)

    @staticmethod
    def build(sel: TapSelection, n_chunks: int, H: int, C: int, K: int, V: int, device) -> "TapPlan":
        lo, hi = sel.chunk_range(n_chunks)
        slot = _head_slots(sel.head_list(H), H, torch.device(device))
        aliased = tuple(n for n in sel.names if n in ALIAS_TAPS) if knob("TAPS_ALIAS", 1) else ()
        stored = TapSelection(tuple(n for n in sel.names if n not in aliased), sel.chunks, sel.heads)
        later = tuple(n for n in stored.names if n in STATE_FILL_TAPS) if knob("TAPS_FILL_STATE", 1) else ()
        bufs, flat = alloc_tap_buffers_grouped(stored, n_chunks, H, C, K, V, device, later)
        return TapPlan(sel, lo, hi, slot, bufs, len(sel.head_list(H)), flat, aliased, (H, C, K, V))

    def has(self, name: str) -> bool:
        """Whether a kernel stores tap ``name`` (selected and not aliased)."""
        return name in self._buffers

    def get(self, name: str) -> torch.Tensor:
        """Tap ``name``'s buffer for a kernel to write: NaN-filled, or one of ``unfilled``'s views,
        which the backward state pass fills before any kernel writes them (``take_unfilled``)."""
        return self._buffers[name]

    def own(self, name: str) -> None:
        """Tap ``name``, if aliased, gets a NaN-filled buffer of its own for a kernel to store instead: the
        kernels' tensor holds a rounded copy of it (``Mqk``, ``U``, ``dU`` in bf16: ``prepare.mqk_bf16``,
        ``udu_bf16``)."""
        if name not in self.aliased:
            return
        H, C, K, V = self.shape
        self.aliased = tuple(n for n in self.aliased if n != name)
        self._buffers[name] = torch.full((max(self.hi - self.lo, 0), self.n_sel, *REGISTRY[name].dims(C, K, V)),
                                         float("nan"), device=self.head_slot.device)
        self._read = None

    def take_unfilled(self) -> torch.Tensor | None:
        """The flat tensor still to be NaN-filled (None if none), which the caller now fills."""
        flat, self.unfilled = self.unfilled, None
        return flat

    def fill_unfilled(self) -> None:
        """NaN-fill the flat tensor now, if no kernel has taken it (``take_unfilled``)."""
        flat = self.take_unfilled()
        if flat is not None:
            flat.fill_(float("nan"))

    def bind_window(self, start, length, seq, t) -> None:
        """The chunk tables of ``chunk_layout`` (host), so that ``alias`` needs no read-back."""
        self.window = TapWindow.of(self.lo, self.hi, self.shape[1], start, length, seq, t)

    def _window(self, chunks: KernelChunks) -> TapWindow:
        if self.window is None:  # read back from the device (a caller that did not bind the tables)
            seq = chunks.chunk_seq.long()
            t = torch.arange(chunks.n_chunks, device=seq.device) - chunks.seq_chunk_base.long()[seq]
            self.window = TapWindow.of(self.lo, self.hi, self.shape[1], chunks.chunk_start, chunks.chunk_len, seq,
                                       t)
        return self.window

    def alias(self, chunks: KernelChunks, **tensors) -> None:
        """Register the kernels' tensors that hold aliased taps (``name=tensor``; ``dS=(dSn, dh0, ext)``
        with ``ext`` None or, for one sequence, the tensor ``[NC + 1, ...]`` whose views dh0 and dSn are),
        before any kernel writes them: each is NaN-filled over the tap window here."""
        for name, x in tensors.items():
            if name not in self.aliased or self.hi <= self.lo:
                continue
            win, nan = self._window(chunks), float("nan")
            kind = ALIAS_TAPS[name]
            # one write-only fill_ each (a multi-tensor multiply by NaN reads the memory too: slower on the
            # H200, docs/benchmarks.md)
            if kind == "chunk":
                x[self.lo:self.hi].fill_(nan)
            elif kind == "token":
                t0, t1 = win.token_span()
                x[t0:t1].fill_(nan)
            else:  # dS of chunk c is dSn[c - 1], or dh0 for a sequence's first chunk
                dSn, dh0, _ = x
                dSn[max(self.lo - 1, 0):self.hi - 1].fill_(nan)
                dh0.fill_(nan)
            self._sources[name] = x
            self._read = None

    def _dev(self, name: str, host: torch.Tensor, device) -> torch.Tensor:
        """A host index table of the window on ``device``, copied once, without waiting for the GPU."""
        key = (name, str(device))
        if key not in self._tables:
            self._tables[key] = to_device(host, device)
        return self._tables[key]

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        heads = self.selection.head_list(self.shape[0])
        if heads == tuple(range(self.shape[0])):
            return x
        return x.index_select(1, self._dev("heads", torch.tensor(heads), x.device))

    def _read_alias(self, name: str) -> torch.Tensor:
        """Aliased tap ``name`` as ``[hi-lo, n_sel, *shape]``: a view of the kernels' tensor where the
        layouts agree, else gathered (padding rows 0); NaN if its stage did not run."""
        H, C, K, V = self.shape
        n, lo, hi = self.hi - self.lo, self.lo, self.hi
        x = self._sources.get(name)
        if x is None or n <= 0:
            dims = REGISTRY[name].dims(C, K, V)
            return torch.full((max(n, 0), self.n_sel, *dims), float("nan"), device=self.head_slot.device)
        kind, win = ALIAS_TAPS[name], self.window
        if kind == "chunk":
            return self._heads(x[lo:hi])
        if kind == "state":
            dSn, dh0, ext = x
            if ext is not None:  # [dh0, dSn...]: dS of chunk c at c
                return self._heads(ext[lo:hi])
            if not win.any_first:
                return self._heads(dSn[lo - 1:hi - 1])
            dev = dSn.device
            out = dSn.index_select(0, self._dev("prev", (torch.arange(lo, hi) - 1).clamp(min=0), dev))
            first = win.first.nonzero().flatten()
            out.index_copy_(0, self._dev("first", first, dev),
                            dh0.index_select(0, self._dev("first_seq", win.seq[first], dev)))
            return self._heads(out)
        rest = tuple(x.shape[2:])
        if win.dense:  # full chunks one after another: the window's rows as they lie
            t0 = int(win.start[0])
            return self._heads(x[t0:t0 + n * C].view(n, C, H, *rest).transpose(1, 2))
        r = torch.arange(C)
        rows = (win.start[:, None] + r).clamp(max=x.shape[0] - 1).flatten()
        out = x.reshape(x.shape[0], -1).index_select(0, self._dev("rows", rows, x.device)).view(n, C, -1)
        pad = self._dev("pad", (r[None, :] >= win.length[:, None])[:, :, None], x.device)
        return self._heads(out.masked_fill_(pad, 0.).view(n, C, H, *rest).transpose(1, 2))

    @property
    def buffers(self) -> dict[str, torch.Tensor]:
        """Every selected tap, ``[hi-lo, n_sel_heads, *shape]``, NaN where nothing was written (the
        stored buffers filled here if the backward did not run; aliased taps read from the kernels'
        tensors)."""
        self.fill_unfilled()
        if self._read is None:
            self._read = {n: self._read_alias(n) for n in self.aliased}
        return {n: self._read[n] if n in self._read else self._buffers[n] for n in self.selection.names}


def _head_slots(heads: tuple[int, ...], H: int, device: torch.device) -> torch.Tensor:
    """``[H]`` int32 on ``device``: head ``h``'s slot in the tap buffers, -1 if not selected (a table of its
    own per plan: tests clear a plan's slots to see what its kernels write)."""
    slot = [-1] * H
    for i, h in enumerate(heads):
        slot[h] = i
    return to_device(torch.tensor(slot, dtype=torch.int32), device)


def chunk_launches(plan: TapPlan | None, n_chunks: int) -> list[tuple[int, int, bool]]:
    """How a kernel parallel over chunks is launched: ``(c0, c1, taps)`` per launch. The chunks of the
    tap window run the variant that stores taps; the others run the variant without them, which
    computes the same bits (taps are extra stores: the tests and ``benchmarks/layout_check.py`` hold
    both variants to that) and carries no tap code's registers or spills."""
    if plan is None or plan.hi <= plan.lo:
        return [(0, n_chunks, False)]
    parts = [(0, plan.lo, False), (plan.lo, plan.hi, True), (plan.hi, n_chunks, False)]
    return [p for p in parts if p[1] > p[0]]


def heads_first() -> bool:
    """Whether the kernels parallel over chunks and heads launch heads first (knob ``HEADS_FIRST``, launch only:
    the same bits; ``chunk_grid``)."""
    return knob("HEADS_FIRST", 1) != 0


def chunk_grid(n_chunks: int, H: int, nb: int = 1, *, first: bool, grid: tuple[int, ...]) -> tuple[int, ...]:
    """The grid of a kernel parallel over ``n_chunks`` chunks, ``H`` heads and ``nb`` K or V blocks: with
    ``first`` (``heads_first``) one axis of ``n_chunks * H * nb`` programs, the heads and blocks of a chunk
    adjacent (``tlmath.chunk_head_block`` names a program's chunk, head and block); else ``grid``, the
    kernel's own 2- or 3-D grid with the chunks adjacent."""
    return (n_chunks * H * nb,) if first else grid


def tap_kernel_args(plan: TapPlan | None, names: tuple[str, ...], dummy: torch.Tensor, chunks: KernelChunks):
    """Kernel arguments for one stage's taps: ``(buffers, head_slot, lo, hi, n_sel, store, present)``.

    ``buffers`` follows ``names``; a tap not in the plan gets ``dummy`` and ``present[name] = False``
    so its store compiles out; ``store`` is False when the stage records nothing at all, and then
    ``head_slot`` is the chunk table's ``chunk_len`` (any int32 pointer: it is never read).
    """
    present = {n: plan is not None and plan.has(n) for n in names}
    bufs = [plan.get(n) if present[n] else dummy for n in names]
    if plan is None or not any(present.values()):
        return bufs, chunks.chunk_len, 0, 0, 0, False, present
    return bufs, plan.head_slot, plan.lo, plan.hi, plan.n_sel, True, present
