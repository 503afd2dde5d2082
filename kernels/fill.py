"""NaN fills of tap buffers: many regions in one launch, or a few blocks a chain step inside a state pass.

Every tap buffer starts NaN-filled before a kernel writes it, so that an element no kernel wrote shows.
A ``Fills`` list holds contiguous fp32 regions of one device (tap buffers, and the tap window's rows of
the kernels' tensors that hold aliased taps). A kernel gets them as scalars, up to ``MAX_REGIONS`` at a
time: ``fill_base`` (the first region) and, per region, its offset from there and its size in fp32
elements (no table to copy to the device, no loop over the regions on the host). Each region is cut into
pieces of ``per`` blocks of ``FB`` elements, region after region, and program ``p`` fills piece ``p``
(``fill_piece``: scalar arithmetic only). ``nan_fill_kernel`` fills every region in one launch, a block a
program (a ``fill_`` per region is a launch each, and each launch costs the GPU a gap); the state passes,
whose programs wait on their chain's products, fill their piece a few blocks a chain step
(``recurrence.kda_fwd_recurrence_kernel``, ``recurrence_bwd.recurrence_bwd_kernel``): the piece is formed
before the chain, so that no step waits on a load (``benchmarks/loop_check.py --taps``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FB = 512  # elements of a block (the state passes' fill step)
FB_LAUNCH = 2048  # elements of a block of the fill kernel's programs
MAX_REGIONS = 4  # regions a kernel takes (more: several fill launches)
# the region scalars change with every call's addresses: typed int64 and never specialized (no recompilation)
REGION_ARGS = ("fo0", "fn0", "fo1", "fn1", "fo2", "fn2", "fo3", "fn3", "fill_per")


@triton.jit
def _next_region(q, off, n, fo, fn, per, FB: tl.constexpr):
    """Piece ``q`` counted from the current region (``off``, ``n``): where it is past that region's pieces,
    counted from the next (``fo``, ``fn``) instead."""
    k = tl.cdiv(tl.cdiv(n, FB), per)
    move = q >= k
    return tl.where(move, q - k, q), tl.where(move, fo, off), tl.where(move, fn, n)


@triton.jit
def fill_piece(pid, per, fo0, fn0, fo1, fn1, fo2, fn2, fo3, fn3, NSEG: tl.constexpr, FB: tl.constexpr):
    """Program ``pid``'s piece: ``(offset, region size, first block, last block + 1)``, its blocks counted in
    its region; past the last region's pieces an empty range."""
    q, off, n = pid.to(tl.int64), fo0.to(tl.int64), fn0.to(tl.int64)
    if NSEG > 1:
        q, off, n = _next_region(q, off, n, fo1, fn1, per, FB)
    if NSEG > 2:
        q, off, n = _next_region(q, off, n, fo2, fn2, per, FB)
    if NSEG > 3:
        q, off, n = _next_region(q, off, n, fo3, fn3, per, FB)
    lo = q * per
    return off, n, lo, tl.minimum(lo + per, tl.cdiv(n, FB))


@triton.jit
def fill_block(fill_base, f_off, f_n, j, FB: tl.constexpr, ALIGNED: tl.constexpr):
    """NaN-fill block ``j`` of the region at ``fill_base + f_off`` of ``f_n`` elements. ``ALIGNED``: every
    region starts on a 16-byte boundary and holds a multiple of 4 elements (a thread stores 16 bytes)."""
    if ALIGNED:
        f_off, f_n = tl.multiple_of(f_off, 4), tl.multiple_of(f_n, 4)
    o = j * FB + tl.arange(0, FB)
    tl.store(fill_base + f_off + o, tl.full([FB], float("nan"), tl.float32), mask=o < f_n)


@triton.jit(do_not_specialize=REGION_ARGS)
def nan_fill_kernel(fill_base, fo0: tl.int64, fn0: tl.int64, fo1: tl.int64, fn1: tl.int64, fo2: tl.int64,
                    fn2: tl.int64, fo3: tl.int64, fn3: tl.int64, fill_per: tl.int64, NSEG: tl.constexpr,
                    FB: tl.constexpr, ALIGNED: tl.constexpr):
    f_off, f_n, f_lo, _ = fill_piece(tl.program_id(0), fill_per, fo0, fn0, fo1, fn1, fo2, fn2, fo3, fn3, NSEG, FB)
    fill_block(fill_base, f_off, f_n, f_lo, FB, ALIGNED)


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


class Fills:
    """Regions to NaN-fill (contiguous fp32 tensors of one device), filled in one launch (``launch``), by a
    state pass (``state_pass_fill``) or by ``fill_`` each (``fill_each``)."""

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

    def args(self, per: int) -> dict:
        """The region scalars of a kernel (``fill_base``, ``fo0, fn0, ...``, ``fill_per``, ``NSEG``,
        ``ALIGNED``); at most ``MAX_REGIONS`` regions."""
        base, p0 = self.regions[0], self.regions[0].data_ptr()
        a = dict(fill_base=base, fill_per=per, NSEG=len(self.regions), ALIGNED=int(all(
            x.data_ptr() % 16 == 0 and x.numel() % 4 == 0 for x in self.regions)))
        for r in range(MAX_REGIONS):
            x = self.regions[r] if r < len(self.regions) else None
            a[f"fo{r}"], a[f"fn{r}"] = ((x.data_ptr() - p0) // 4, x.numel()) if x is not None else (0, 0)
        return a

    def fill_each(self) -> None:
        for x in self.regions:
            x.fill_(float("nan"))

    def launch(self) -> None:
        """Every region NaN-filled: one launch per ``MAX_REGIONS`` regions (on the CPU, ``fill_`` each)."""
        if not self.regions:
            return
        if self.regions[0].device.type != "cuda":
            self.fill_each()
            return
        for r in range(0, len(self.regions), MAX_REGIONS):
            part = Fills()
            part.regions = self.regions[r:r + MAX_REGIONS]
            nan_fill_kernel[(part.blocks(FB_LAUNCH),)](**part.args(1), FB=FB_LAUNCH, num_warps=4)

    def state_pass_args(self, n_prog: int, max_steps: int) -> dict | None:
        """Kernel arguments of a state pass that fills these regions, ``n_prog`` programs whose longest
        chain has ``max_steps`` steps: pieces of ``per`` blocks, at most one a program (``fill_piece``),
        ``FILL`` blocks a step (a power of two, few compiled variants, with which the longest chain covers a
        piece; the rest after the chain). None where the pieces would outnumber the programs, or the
        regions ``MAX_REGIONS``."""
        n = len(self.regions)
        if n > MAX_REGIONS or n_prog <= n:
            return None
        # pieces: sum over regions of ceil(blocks / per) <= blocks / per + n <= n_prog
        per = triton.cdiv(self.blocks(FB), n_prog - n)
        a = self.args(per)
        a["FILL_ALIGNED"] = a.pop("ALIGNED")
        del a["NSEG"]
        return dict(a, FILL_NSEG=n, FILL=triton.next_power_of_2(triton.cdiv(per, max(max_steps, 1))), FB=FB)


def state_pass_fill(fills: Fills | None, n_prog: int, max_steps: int, dummy: torch.Tensor) -> dict:
    """A state pass's fill arguments for ``fills`` (None: nothing to fill); where it cannot take them
    (``Fills.state_pass_args``), they are filled here in one launch and the pass fills nothing."""
    args = fills.state_pass_args(n_prog, max_steps) if fills else None
    if args is None:
        if fills:
            fills.launch()
        args = dict(fill_base=dummy, fill_per=0, FILL_NSEG=1, FILL=0, FB=FB, FILL_ALIGNED=0,
                    **{f"f{c}{r}": 0 for r in range(MAX_REGIONS) for c in "on"})
    return args
