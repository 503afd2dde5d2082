"""NaN fills of tap buffers: many regions in one launch, or a few blocks a chain step inside a state pass.

Every tap buffer starts NaN-filled before a kernel writes it, so that an element no kernel wrote shows.
A ``Fills`` list holds contiguous fp32 regions of one device (tap buffers, and the tap window's rows of
the kernels' own tensors that hold aliased taps). Each region is cut into blocks of ``FB`` elements (its
last block masked), numbered region after region; a small int64 device table holds, per region, its
offset in fp32 elements from the first region's start (the kernels' ``base`` pointer), its element count
and its first block. ``nan_block`` fills one block: ``nan_fill_kernel`` fills
every block in one launch (one ``fill_`` per region is a launch each, and each launch costs the GPU a
gap); the state passes, whose programs wait on their chain's products, fill a piece of the blocks a step
(``recurrence.kda_fwd_recurrence_kernel``, ``recurrence_bwd.recurrence_bwd_kernel``), each program's piece
read before its chain (``state_pass_args``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FB = 512  # elements of a block (the state passes' fill step)
FB_LAUNCH = 2048  # elements of a block of the fill kernel's programs


@triton.jit
def nan_block(base, table, j, NSEG: tl.constexpr, FB: tl.constexpr, ALIGNED: tl.constexpr = 0):
    """NaN-fill block ``j`` (>= 0) of a ``Fills`` table of ``NSEG`` regions, whose offsets count fp32
    elements from ``base``; past the last block, nothing. ``ALIGNED``: every region starts on a 16-byte
    boundary and holds a multiple of 4 elements, so that a thread stores 16 bytes at once."""
    s = 0
    for r in tl.static_range(1, NSEG):
        s += (j >= tl.load(table + 3 * r + 2)).to(tl.int32)
    off, n = tl.load(table + 3 * s), tl.load(table + 3 * s + 1)
    if ALIGNED:
        off, n = tl.multiple_of(off, 4), tl.multiple_of(n, 4)
    o = (j - tl.load(table + 3 * s + 2)) * FB + tl.arange(0, FB)
    tl.store(base + off + o, tl.full([FB], float("nan"), tl.float32), mask=o < n)


@triton.jit
def nan_fill_kernel(base, table, NSEG: tl.constexpr, FB: tl.constexpr, ALIGNED: tl.constexpr = 0):
    nan_block(base, table, tl.program_id(0).to(tl.int64), NSEG, FB, ALIGNED)


class Fills:
    """Regions to NaN-fill (contiguous fp32 tensors of one device), filled in one launch (``launch``), by a
    state pass (``table``) or by ``fill_`` each (``fill_each``)."""

    def __init__(self):
        self.regions: list[torch.Tensor] = []

    def add(self, x: torch.Tensor) -> None:
        if x.dtype != torch.float32 or not x.is_contiguous():
            raise ValueError(f"Fills.add: expected a contiguous float32 tensor, found {x.dtype} "
                             f"{'contiguous' if x.is_contiguous() else 'strided'}")
        if x.numel():
            self.regions.append(x)

    def __bool__(self) -> bool:
        return bool(self.regions)

    def blocks(self, fb: int) -> int:
        return sum(triton.cdiv(x.numel(), fb) for x in self.regions)

    def table(self, fb: int) -> torch.Tensor:
        """``[n_regions, 3]`` int64 on the regions' device: per region its offset from the first region's
        start in fp32 elements (the kernels' ``base``), its elements and its first block. The regions must
        outlive the kernel that reads it (the tap plan and the stages hold them)."""
        from .common import to_device

        rows, first, p0 = [], 0, self.regions[0].data_ptr()
        for x in self.regions:
            rows.append(((x.data_ptr() - p0) // 4, x.numel(), first))
            first += triton.cdiv(x.numel(), fb)
        return to_device(torch.tensor(rows, dtype=torch.int64), self.regions[0].device)

    def aligned(self) -> int:
        """1 when every region starts on a 16-byte boundary and holds a multiple of 4 elements."""
        return int(all(x.data_ptr() % 16 == 0 and x.numel() % 4 == 0 for x in self.regions))

    def fill_each(self) -> None:
        for x in self.regions:
            x.fill_(float("nan"))

    def launch(self) -> None:
        """Every region in one launch (on the CPU, without a GPU, ``fill_`` each)."""
        if not self.regions:
            return
        if self.regions[0].device.type != "cuda":
            self.fill_each()
            return
        nan_fill_kernel[(self.blocks(FB_LAUNCH),)](self.regions[0], self.table(FB_LAUNCH), NSEG=len(self.regions),
                                                     FB=FB_LAUNCH, ALIGNED=self.aligned(), num_warps=4)

    def state_pass_args(self, n_prog: int, max_steps: int) -> dict:
        """Kernel arguments of a state pass that fills these regions, ``n_prog`` programs whose longest
        chain has ``max_steps`` steps. The blocks are cut into at most ``n_prog`` pieces of at most ``per``
        blocks, none across two regions; program ``p`` fills piece ``p``, ``FILL`` blocks a step (a power
        of two, few compiled variants, with which the longest chain covers a piece; the rest after the
        chain). ``fill_tab`` [n_prog, 4] int64: the piece's region offset (from ``fill_base``, in elements)
        and size, and its first and last blocks (of the region) plus one: loaded before the chain, so that
        no step waits on a load. None when there are more pieces than programs."""
        from .common import to_device

        blocks = [triton.cdiv(x.numel(), FB) for x in self.regions]
        n = len(blocks)
        per = triton.cdiv(sum(blocks), max(n_prog - n, 1)) if n_prog > n else max(blocks)
        rows, p0 = [], self.regions[0].data_ptr()
        for x, nb in zip(self.regions, blocks):
            rows += [((x.data_ptr() - p0) // 4, x.numel(), b, min(b + per, nb)) for b in range(0, nb, per)]
        if len(rows) > n_prog:  # fewer programs than pieces (a launch of fewer programs than regions)
            return None
        rows += [(0, 0, 0, 0)] * (n_prog - len(rows))
        return dict(fill_base=self.regions[0], fill_tab=to_device(torch.tensor(rows, dtype=torch.int64),
                                                                  self.regions[0].device),
                    FILL=triton.next_power_of_2(triton.cdiv(per, max(max_steps, 1))), FB=FB,
                    FILL_ALIGNED=self.aligned())


def state_pass_fill(fills: Fills | None, n_prog: int, max_steps: int, dummy: torch.Tensor) -> dict:
    """A state pass's fill arguments for ``fills`` (None: nothing to fill); where its programs are fewer than
    the pieces, the regions are filled here in one launch and the pass fills nothing."""
    args = fills.state_pass_args(n_prog, max_steps) if fills else None
    if args is None:
        if fills:
            fills.launch()
        args = dict(fill_base=dummy, fill_tab=dummy, FILL=0, FB=FB, FILL_ALIGNED=0)
    return args


@triton.jit
def fill_piece(fill_tab, pid):
    """Program ``pid``'s fill piece: (offset, region size, first block, last block + 1), loaded once."""
    t = fill_tab + pid.to(tl.int64) * 4
    return tl.load(t), tl.load(t + 1), tl.load(t + 2), tl.load(t + 3)


@triton.jit
def fill_block(fill_base, f_off, f_n, j, FB: tl.constexpr, ALIGNED: tl.constexpr):
    """NaN-fill block ``j`` of the region at ``fill_base + f_off`` of ``f_n`` elements."""
    if ALIGNED:
        f_off, f_n = tl.multiple_of(f_off, 4), tl.multiple_of(f_n, 4)
    o = j * FB + tl.arange(0, FB)
    tl.store(fill_base + f_off + o, tl.full([FB], float("nan"), tl.float32), mask=o < f_n)


@triton.jit
def fill_step(fill_base, f_off, f_n, f_lo, f_hi, i, FILL: tl.constexpr, FB: tl.constexpr, ALIGNED: tl.constexpr):
    """Step ``i`` of a state pass's fill: blocks ``f_lo + i FILL ...`` of its piece ``[f_lo, f_hi)``."""
    for jj in tl.static_range(FILL):
        j = f_lo + i * FILL + jj
        if j < f_hi:
            fill_block(fill_base, f_off, f_n, j, FB, ALIGNED)


@triton.jit
def fill_rest(fill_base, f_off, f_n, f_lo, f_hi, n_steps, FILL: tl.constexpr, FB: tl.constexpr,
              ALIGNED: tl.constexpr):
    """What a short chain's steps left of its piece."""
    for j in range(f_lo + n_steps * FILL, f_hi):
        fill_block(fill_base, f_off, f_n, j, FB, ALIGNED)
