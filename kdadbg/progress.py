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
    (never complete before the call ends); past the estimate the total moves with the seconds (``31/32``,
    then ``33/34``: a user trial watched fla's bar sit at 19/20 for 15 s); without an estimate, or
    one under ``min_s``, 0/1 repeated while it runs (``beating``: a log gets a line with the elapsed time every
    5 s) then 1/1."""
    if progress is None:
        yield
        return
    if not estimate_s or estimate_s < min_s:
        with beating(progress, stage, every_s):
            yield
        progress(stage, 1, 1)
        return
    total = max(1, int(round(estimate_s)))
    label = f"{stage}, seconds of about {total} estimated"
    stop = threading.Event()
    t0 = time.perf_counter()

    def tick():
        while not stop.wait(every_s):
            e = int(time.perf_counter() - t0)
            progress(label, e, total) if e < total else progress(label, e, e + 1)

    progress(label, 0, total)
    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    end = max(total, int(time.perf_counter() - t0) + 1)
    progress(label, end, end)


class Heartbeat:
    """``progress(stage, 0, 1)`` every ``every_s`` from a thread until ``stop()``: a stage that reports nothing
    itself (fla's kernels, one long reference call, a file being written) still shows its elapsed time, the
    bar's clock on a terminal, a line at most every 5 s in a log (``render.tables.progress_display``)."""

    def __init__(self, progress: Progress, stage: str, every_s: float = 2.0, quiet_s: float = 0.0):
        """``quiet_s``: nothing shown before that many seconds (a stage whose refusals come early and alone)."""
        self._stop = threading.Event()
        if not quiet_s:
            progress(stage, 0, 1)

        def beat():
            if quiet_s and self._stop.wait(quiet_s):
                return
            if quiet_s:
                progress(stage, 0, 1)
            while not self._stop.wait(every_s):
                progress(stage, 0, 1)

        self._thread = threading.Thread(target=beat, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def beating(progress: Progress | None, stage: str, every_s: float = 2.0, quiet_s: float = 0.0):
    """``with beating(progress, "fla"): run()``: a ``Heartbeat`` for the duration (nothing without progress);
    ``quiet_s``: silent for that long first."""
    if progress is None:
        yield
        return
    beat = Heartbeat(progress, stage, every_s, quiet_s)
    try:
        yield
    finally:
        beat.stop()
