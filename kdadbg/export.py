"""``kdadbg taps``: run one source on a dump and write its outputs, gradients and taps to a taps file."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from .chunks import chunk_table
from .config import KDAConfig, KDAInputs
from .dump import load_dump
from .errors import KdadbgError
from .selection import resolve_selection
from .tapsfile import chunk_rows, outputs_that_apply, taps_metadata, write_taps_file

SOURCES = ("reference",)
DEVICES = ("auto", "cpu", "cuda")

Progress = Callable[[str, int, int], None]


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a CUDA device is present, else ``cpu``; ``cuda`` must be present."""
    if device not in DEVICES:
        raise KdadbgError(f"--device: expected one of {', '.join(DEVICES)}, found {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise KdadbgError("--device cuda: no CUDA device is available (use --device cpu)")
    return device


def _reference(inputs: KDAInputs, config: KDAConfig, names: tuple[str, ...], device: str,
               progress: Progress | None) -> tuple[dict, dict]:
    from .reference import run_reference

    res = run_reference(inputs, config, taps=names, device=device, dtype=torch.float64, progress=progress)
    return res.outputs, res.taps


def export_taps(dump, out, source: str = "reference", names: tuple[str, ...] | None = None,
                chunks: tuple[int | None, int | None] | None = None, heads: tuple[int, ...] | None = None,
                device: str = "auto", overrides: dict | None = None, force: bool = False,
                allow_nonfinite: bool = False, progress: Progress | None = None) -> dict:
    """Run ``source`` on the dump ``dump`` and write the taps file ``out``; returns a summary.

    ``names``: taps to export (None = all); ``chunks``: half-open global chunk range, either end
    None; ``heads``: head indices (None = all); ``overrides``: config values that beat the dump's.
    Example: ``export_taps("d.safetensors", "t.safetensors", names=("dS",), chunks=(0, 4))``.
    """
    from kdadbg_kernels.taps import TAP_NAMES

    if source not in SOURCES:
        raise KdadbgError(f"--source: expected one of {', '.join(SOURCES)}, found {source!r}")
    names = TAP_NAMES if names is None else tuple(names)
    if Path(out).exists() and not force:
        raise KdadbgError(f"{out}: already exists; refusing to overwrite (use --force)")
    inputs, config = load_dump(dump, overrides, allow_nonfinite=allow_nonfinite)
    B, T, H, K, V = inputs.shape
    table = chunk_table(B, T, inputs.cu_seqlens, config.chunk_size)
    sel = resolve_selection(names, chunks, heads, table.n_chunks, H)
    dev = resolve_device(device)

    outputs, taps = _reference(inputs, config, sel.names, dev, progress)

    lo, hi = sel.chunk_range(table.n_chunks)
    head_list = list(sel.head_list(H))
    head_idx = torch.tensor(head_list, dtype=torch.long)
    picked = {}
    for name in sel.names:
        t = taps[name].detach().to("cpu")
        picked[name] = t[lo:hi].index_select(1, head_idx)
    applies = outputs_that_apply(inputs, config)
    missing = [n for n in applies if n not in outputs]
    if missing:
        raise RuntimeError(f"source {source} returned no {missing}")
    outs = {n: outputs[n].detach().to("cpu") for n in applies}
    path = write_taps_file(out, outs, picked, chunk_rows(table, lo, hi), head_list,
                           taps_metadata(source, dump, config), force=force)
    nonfinite = sorted(n for n, t in {**outs, **picked}.items() if not bool(torch.isfinite(t).all()))
    return {"out": str(path), "dump": str(dump), "source": source, "device": dev, "config": config.as_dict(),
            "taps": list(sel.names), "chunks": [lo, hi], "n_chunks": table.n_chunks, "heads": head_list,
            "outputs": list(applies), "nonfinite": nonfinite, "bytes": path.stat().st_size}
