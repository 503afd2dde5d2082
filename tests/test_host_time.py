"""The host side of a kernel call: the tap window's tables, the launch arithmetic, and
``benchmarks/host_time.py`` (our wrapper's own host time, launches stubbed, on ``meta`` tensors)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kdadbg_kernels.common import TapWindow, chunk_layout
from kdadbg_kernels.tuning import block_size, cdiv

ROOT = Path(__file__).resolve().parents[1]


def _window_by_rows(lo, hi, C, B, T, cu):
    """The window's first-token span and whether it is dense, from its rows one by one."""
    _, _, _, seq, t, start, length = chunk_layout(B, T, cu, C)
    rows = [int(start[c]) + r for c in range(lo, hi) for r in range(int(length[c]))]
    if not rows:
        return (0, 0), False
    dense = rows == list(range(rows[0], rows[0] + (hi - lo) * C))
    return (rows[0], rows[-1] + 1), dense


@pytest.mark.parametrize("B,T,cu,C,lo,hi", [
    (1, 256, None, 64, 0, 4), (1, 256, None, 64, 1, 3), (2, 130, None, 64, 0, 6), (2, 130, None, 64, 3, 5),
    (2, 128, None, 64, 0, 4), (1, 300, [0, 15, 100, 300], 16, 0, 20), (1, 300, [0, 15, 100, 300], 16, 8, 12),
    (1, 300, [0, 64, 128, 300], 64, 0, 4), (1, 300, [0, 64, 128, 300], 64, 2, 2), (1, 40, None, 16, 2, 3)])
def test_tap_window_span_and_density_match_its_rows(B, T, cu, C, lo, hi):
    """TapWindow.of's token span and ``dense`` (the window's rows lie as the registry's chunk rows) agree with
    the rows listed one by one: tail chunks, windows across sequences, one chunk, an empty window."""
    cu_t = torch.tensor(cu) if cu is not None else None
    _, _, _, seq, t, start, length = chunk_layout(B, T, cu_t, C)
    win = TapWindow.of(lo, hi, C, start, length, seq, t)
    span, dense = _window_by_rows(lo, hi, C, B, T, cu_t)
    assert win.token_span() == span and win.dense == dense
    assert win.first.tolist() == [bool(t[c] == 0) for c in range(lo, hi)]
    assert win.any_first == any(win.first.tolist())


def test_dense_tap_plans_share_their_window_tables_only():
    """Two taps-on calls of one shape read the same host window tables (made once: the plan only reads them),
    while each has its own buffers and its own head-slot table (a caller may clear one plan's slots); a
    different window gets tables of its own."""
    from kdadbg_kernels.chunk import _tap_plan
    from kdadbg_kernels.taps import TapSelection

    sel = TapSelection(chunks=(1, 3), heads=(2, 0))
    a, b = (_tap_plan(sel, 1, 256, 3, 16, 16, None, None, 64, "cpu") for _ in range(2))
    assert a.window is b.window and a.head_slot is not b.head_slot
    assert a.head_slot.tolist() == [1, -1, 0] and (a.lo, a.hi) == (1, 3)
    a.head_slot.fill_(-1)
    assert b.head_slot.tolist() == [1, -1, 0]
    assert a.get("qd").data_ptr() != b.get("qd").data_ptr()
    c = _tap_plan(TapSelection(chunks=(0, 2)), 1, 256, 3, 16, 16, None, None, 64, "cpu")
    assert c.window is not a.window and c.head_slot.tolist() == [0, 1, 2]
    assert c.window.token_span() == (0, 128) and c.window.dense


def test_host_launch_arithmetic_matches_triton():
    """tuning.block_size and cdiv, plain Python on the host, give what Triton's constexpr functions give."""
    import triton

    for n in range(1, 300):
        assert block_size(n) == max(16, triton.next_power_of_2(n))
        assert block_size(n, 64) == min(64, max(16, triton.next_power_of_2(n)))
        for d in (1, 7, 16, 32, 64):
            assert cdiv(n, d) == triton.cdiv(n, d)


@pytest.mark.parametrize("launch", ["stub", "triton"])
def test_host_time_reports_each_setting_with_and_without_taps(launch):
    """benchmarks/host_time.py at a small shape: a line per setting and taps window with its host time, the
    launches asked for (9 without taps; 14 with taps over chunks [0, 4), the kernels parallel over chunks
    launched over the window apart) and the torch operations issued (the taps' NaN fills among them). With
    ``--launch triton`` the launches go through Triton's own launch path to the stand-in kernels, which count
    them: the same 9 and 14."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "host_time.py"), "--H", "2", "--T", "512",
                        "--D", "32", "--iters", "3", "--settings", "pregated,lower_bound", "--taps-window", "0,4",
                        "--launch", launch],
                       capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [x for x in p.stdout.splitlines() if " host " in x]
    assert len(lines) == 4, p.stdout
    for line, (setting, tw, launches) in zip(lines, [("pregated", 0, 9), ("pregated", 4, 14),
                                                      ("lower_bound", 0, 9), ("lower_bound", 4, 14)]):
        assert line.startswith(f"{setting} H2 T512 taps window {tw}: host ")
        assert f"{launches} kernel launches" in line
        ms = float(line.split(": host ")[1].split(" ms")[0])
        assert ms > 0
        assert ("fill_ " in line) == (tw > 0)


def test_host_time_refuses_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "host_time.py"), "--iters", "1"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert p.returncode == 2 and "TRITON_INTERPRET=1" in p.stderr
