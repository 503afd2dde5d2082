"""A tiny dependency-free PNG writer (zlib + struct) and the heatmap of ``kdadbg diff --plot``.

The heatmap has one row of cells per tap (dataflow order, top to bottom), one column per chunk
(left to right) and colours log10 of the worst ratio over heads on a blue → green → yellow → red
scale from ``vmin`` (≤ 1e-8 by default) to ``vmax`` (≥ 1); grey: not compared; magenta: NaN/Inf.
The row names, chunk range and scale go into the file's ``tEXt`` chunks.
"""

from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path

from .errors import KdadbgError
from .fileio import atomic_write_bytes

_STOPS = ((0.0, (48, 18, 59)), (0.25, (40, 120, 220)), (0.5, (30, 190, 110)), (0.75, (245, 210, 40)),
          (1.0, (200, 30, 30)))
MISSING = (128, 128, 128)
NONFINITE = (255, 0, 255)
SEPARATOR = (255, 255, 255)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(rows: list[bytes], width: int, text: dict[str, str] | None = None) -> bytes:
    """An 8-bit RGB PNG from ``rows`` (each ``3 * width`` bytes), with optional ``tEXt`` entries."""
    if any(len(r) != 3 * width for r in rows):
        raise ValueError("every row must hold 3 * width bytes")
    raw = b"".join(b"\x00" + r for r in rows)
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, len(rows), 8, 2, 0, 0, 0))
    for key, value in (text or {}).items():
        out += _chunk(b"tEXt", key.encode("latin-1") + b"\x00" + value.encode("latin-1", "replace"))
    return out + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")


def colour(value: float | None, vmin: float, vmax: float) -> tuple[int, int, int]:
    """The colour of one cell: ``None`` grey, non-finite magenta, else the scale at ``value``."""
    if value is None:
        return MISSING
    if not math.isfinite(value):
        return NONFINITE
    x = min(1.0, max(0.0, (value - vmin) / (vmax - vmin))) if vmax > vmin else 0.0
    for (x0, c0), (x1, c1) in zip(_STOPS, _STOPS[1:]):
        if x <= x1:
            f = (x - x0) / (x1 - x0)
            return tuple(int(round(a + f * (b - a))) for a, b in zip(c0, c1))
    return _STOPS[-1][1]


def write_heatmap(path, values: list[list[float | None]], *, row_names: list[str], col_names: list,
                  breaks: tuple[int, ...] = (), vmin: float = -8.0, vmax: float = 0.0,
                  cell: tuple[int, int] | None = None, title: str = "") -> Path:
    """Write ``values`` (rows × columns of log10 errors) as a PNG heatmap; ``breaks`` are row indices
    before which a white separator line is drawn (stage boundaries)."""
    n_rows, n_cols = len(values), max((len(r) for r in values), default=0)
    if n_rows == 0 or n_cols == 0:
        raise KdadbgError(f"--plot {path}: nothing to plot (no cell was compared)")
    cw, ch = cell or (max(2, min(16, 1600 // n_cols)), 12)
    width = n_cols * cw
    rows: list[bytes] = []
    for i, line in enumerate(values):
        if i in breaks:
            rows.append(bytes(SEPARATOR) * width)
        pix = b"".join(bytes(colour(v, vmin, vmax)) * cw for v in line)
        pix += bytes(MISSING) * cw * (n_cols - len(line))
        rows.extend([pix] * ch)
    text = {"Title": title or "kdadbg diff: log10 error ratio by tap x chunk",
            "Rows": " ".join(row_names), "Columns": f"chunks {col_names[0]}..{col_names[-1]}" if col_names else "",
            "Scale": f"log10 ratio {vmin:g} (blue) .. {vmax:g} (red); grey: not compared; magenta: NaN/Inf"}
    return atomic_write_bytes(encode_png(rows, width, text), path, force=True)


def read_png_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` from a PNG's IHDR (for tests and sanity checks)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return struct.unpack(">II", data[16:24])
