"""Progress of one long call that reports nothing itself (our kernels under the Triton interpreter):
a thread ticks ``progress(stage, elapsed_s, estimate_s)`` every few seconds while the call runs, so
the bar moves and the ETA comes from the estimate; the stage names it as an estimate."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable

Progress = Callable[[str, int, int], None]


@contextmanager
def ticking(progress: Progress | None, stage: str, estimate_s: float | None, every_s: float = 2.0,
            min_s: float = 10.0):
    """``with ticking(progress, "ours", 120.0): run()``: the bar counts seconds against the estimate
    (never past it before the call ends); without an estimate, or one under ``min_s``, 0/1 then 1/1."""
    if progress is None:
        yield
        return
    if not estimate_s or estimate_s < min_s:
        progress(stage, 0, 1)
        yield
        progress(stage, 1, 1)
        return
    total = max(1, int(round(estimate_s)))
    label = f"{stage}, seconds of about {total} estimated"
    stop = threading.Event()
    t0 = time.perf_counter()

    def tick():
        while not stop.wait(every_s):
            progress(label, min(int(time.perf_counter() - t0), total - 1), total)

    progress(label, 0, total)
    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    progress(label, total, total)
