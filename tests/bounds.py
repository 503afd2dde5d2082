"""A bounds check for kernels run under the Triton interpreter: every address a load or store touches (its
mask's lanes that are on) must lie inside a storage of one of the launch's tensor arguments.

On the GPU an address outside every allocation faults ("an illegal memory access"), and one inside another
tensor reads or writes the wrong data; the interpreter does neither reliably: it reads whatever host memory
the address names. ``bounds_checked()`` patches the interpreter's launch and its masked loads and stores for
the duration of a ``with`` block and raises ``OutOfBounds`` naming the kernel, the operation and the first
address outside. It counts the addresses it checked (``BoundsCount``), so a test can say it checked some.

It relies on two internals of ``triton.runtime.interpreter``: ``GridExecutor._init_args_hst`` (the launch's
host copies of its arguments) and ``InterpreterBuilder.create_masked_load``/``create_masked_store``;
``tests/test_bounds.py`` checks that it still catches an address one element past a tensor.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np


class OutOfBounds(AssertionError):
    """A load or store touched an address outside every tensor argument of its launch."""


@dataclass
class BoundsCount:
    launches: int = 0
    addresses: int = 0
    kernels: set = field(default_factory=set)


@contextlib.contextmanager
def bounds_checked():
    """Check every masked-in address of every kernel launched in the block; yields a ``BoundsCount``."""
    import triton.runtime.interpreter as interp

    count = BoundsCount()
    ranges: list[tuple[int, int]] = []
    kernel = [""]
    init0 = interp.GridExecutor._init_args_hst
    load0 = interp.InterpreterBuilder.create_masked_load
    store0 = interp.InterpreterBuilder.create_masked_store

    def add(x):
        if hasattr(x, "untyped_storage"):
            s = x.untyped_storage()
            ranges.append((s.data_ptr(), s.data_ptr() + s.nbytes()))
        elif isinstance(x, (tuple, list)):
            for y in x:
                add(y)

    def init(self, args_dev, kwargs):
        args, kw = init0(self, args_dev, kwargs)
        ranges.clear()
        for x in (*args, *kw.values()):
            add(x)
        kernel[0] = self.fn.__name__
        count.launches += 1
        count.kernels.add(kernel[0])
        return args, kw

    def check(ptrs, mask, itemsize, what):
        p = ptrs.data[mask.data] if mask is not None else ptrs.data.ravel()
        if p.size == 0:
            return
        inside = np.zeros(p.shape, dtype=bool)
        for lo, hi in ranges:
            inside |= (p >= lo) & (p + itemsize <= hi)
        count.addresses += int(p.size)
        if not inside.all():
            bad = p[~inside]
            raise OutOfBounds(f"{kernel[0]}: a {what} touched {bad.size} address(es) outside its tensor arguments, "
                              f"the first {int(bad[0]):#x} ({len(ranges)} argument storages)")

    def load(self, ptrs, mask, other, *args):
        check(ptrs, mask, np.dtype(interp._get_np_dtype(ptrs.get_element_ty())).itemsize, "load")
        return load0(self, ptrs, mask, other, *args)

    def store(self, ptrs, value, mask, *args):
        check(ptrs, mask, value.data.dtype.itemsize, "store")
        return store0(self, ptrs, value, mask, *args)

    interp.GridExecutor._init_args_hst = init
    interp.InterpreterBuilder.create_masked_load = load
    interp.InterpreterBuilder.create_masked_store = store
    try:
        yield count
    finally:
        interp.GridExecutor._init_args_hst = init0
        interp.InterpreterBuilder.create_masked_load = load0
        interp.InterpreterBuilder.create_masked_store = store0
