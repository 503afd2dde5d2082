"""How much memory a run may take: asked before any large allocation."""

from __future__ import annotations

import os

import torch


def free_bytes(device: str) -> int:
    """Memory free for new allocations on ``device`` (the CPU: available physical memory)."""
    if device == "cuda":
        return int(torch.cuda.mem_get_info()[0])
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
