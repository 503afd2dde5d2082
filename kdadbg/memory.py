"""How much memory a run may take: asked before any large allocation."""

from __future__ import annotations

import os

import torch


def free_bytes(device: str) -> int:
    """Memory free for new allocations on ``device`` (the CPU: available physical memory). On CUDA the
    driver's free memory and what torch's caching allocator holds for this process unused (reserved, not
    allocated): the allocator serves new tensors from it first, and hands it back to the driver when an
    allocation would fail otherwise, so in a long-lived process (a training loop, a notebook) memory that
    earlier work left cached is not counted as taken."""
    if device == "cuda":
        cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        return int(torch.cuda.mem_get_info()[0]) + max(int(cached), 0)
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
