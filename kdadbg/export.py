"""``kdadbg taps``: run one source on a dump and write its outputs, gradients and taps to a taps file."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from kdadbg_kernels.taps import TapSelection

from .chunks import chunk_table
from .config import KDAConfig, KDAInputs
from .dump import load_dump
from .errors import KdadbgError
from .selection import resolve_selection
from .tapsfile import chunk_rows, outputs_that_apply, taps_metadata, write_taps_file

SOURCES = ("reference", "kernel")
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


def _reference(inputs: KDAInputs, config: KDAConfig, sel: TapSelection, device: str, precision: str,
               progress: Progress | None) -> tuple[dict, dict]:
    """float64 outputs and the selected taps ``[n_sel_chunks, n_sel_heads, ...]``."""
    from .reference import run_reference

    res = run_reference(inputs, config, taps=sel.names, device=device, dtype=torch.float64, progress=progress)
    lo, hi = sel.chunk_range(res.chunks.n_chunks)
    heads = torch.tensor(sel.head_list(inputs.shape[2]), dtype=torch.long, device=device)
    return res.outputs, {n: t[lo:hi].index_select(1, heads) for n, t in res.taps.items()}


def _kernel(inputs: KDAInputs, config: KDAConfig, sel: TapSelection, device: str, precision: str,
            progress: Progress | None) -> tuple[dict, dict]:
    """Our kernels' float32 outputs and tap buffers (already selected by the kernels)."""
    from .backend import check_tap_memory, kernel_taps

    check_tap_memory(inputs, config, sel, device)  # a refusal comes before any progress line
    if progress:
        progress("kernels (forward+backward)", 0, 1)
    outputs, buffers = kernel_taps(inputs, config, precision, device, sel)
    if progress:
        progress("kernels (forward+backward)", 1, 1)
    return outputs, buffers


def export_taps(dump, out, source: str = "reference", names: tuple[str, ...] | None = None,
                chunks: tuple[int | None, int | None] | None = None, heads: tuple[int, ...] | None = None,
                device: str = "auto", overrides: dict | None = None, force: bool = False,
                allow_nonfinite: bool = False, progress: Progress | None = None, precision: str = "fp32") -> dict:
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

    run = _reference if source == "reference" else _kernel
    outputs, taps = run(inputs, config, sel, dev, precision, progress)

    lo, hi = sel.chunk_range(table.n_chunks)
    head_list = list(sel.head_list(H))
    picked = {name: taps[name].detach().to("cpu") for name in sel.names}
    applies = outputs_that_apply(inputs, config)
    missing = [n for n in applies if n not in outputs]
    if missing:
        raise RuntimeError(f"source {source} returned no {missing}")
    outs = {n: outputs[n].detach().to("cpu") for n in applies}
    path = write_taps_file(out, outs, picked, chunk_rows(table, lo, hi), head_list,
                           taps_metadata(source, dump, config, precision if source == "kernel" else None),
                           force=force)
    nonfinite = sorted(n for n, t in {**outs, **picked}.items() if not bool(torch.isfinite(t).all()))
    return {"out": str(path), "dump": str(dump), "source": source, "device": dev, "config": config.as_dict(),
            "taps": list(sel.names), "chunks": [lo, hi], "n_chunks": table.n_chunks, "heads": head_list,
            "outputs": list(applies), "nonfinite": nonfinite, "bytes": path.stat().st_size}
