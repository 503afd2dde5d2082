"""``kdadbg taps``: run one source on a dump and write its outputs, gradients and taps to a taps file."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from .chunks import chunk_table
from .compare import nonfinite_inputs
from .dump import load_dump
from .errors import KdadbgError
from .selection import resolve_selection
from .tapsfile import chunk_rows, outputs_that_apply, taps_metadata, write_taps_file

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


def exp_overflow_note(nonfinite: list[str], inputs, config, table, lo: int, hi: int,
                      taps: dict | None = None) -> str | None:
    """Where every non-finite export is a tap carrying exp(-gc) (``ki``, ``dqd``, ``dkd``) and a chunk's
    cumulative gate passes float32's exp range (-gc > 88.7, the gate's float64 cumsum here), why: float32
    cannot hold them there, whatever the kernels do (``diff`` judges those cells UNREP). None otherwise, and
    where ``taps`` (name: ``[hi-lo, heads, ...]``) holds a non-finite value in a chunk within the range: that
    one no rounding explains."""
    from .noise import EXP_LIMIT_FP32, EXP_NEG_GC_TAPS, chunks_past_exp_range

    if not nonfinite or not set(nonfinite) <= set(EXP_NEG_GC_TAPS) or hi <= lo:
        return None
    chunks = [c for c in chunks_past_exp_range(inputs, config, table) if lo <= c < hi]
    if not chunks:
        return None
    for n in nonfinite if taps else ():
        t = taps[n]
        bad = (~torch.isfinite(t)).reshape(t.shape[0], -1).any(1)
        if any(lo + int(i) not in chunks for i in torch.nonzero(bad).flatten()):
            return None
    from .render import id_ranges

    return (f"{', '.join(nonfinite)} carry exp(-gc), which float32 cannot hold where a chunk's cumulative gate "
            f"passes -{EXP_LIMIT_FP32:.1f} (chunks {id_ranges(chunks)} of this dump, the only chunks they are in): "
            f"expected of a float32 source with gates this strong, not by itself a fault (exit 0); kdadbg diff "
            f"judges such cells UNREP and prints the exp arguments per chunk")


def export_taps(dump, out, source: str = "reference", names: tuple[str, ...] | None = None,
                chunks: tuple[int | None, int | None] | None = None, heads: tuple[int, ...] | None = None,
                device: str = "auto", overrides: dict | None = None, force: bool = False,
                allow_nonfinite: bool = False, progress: Progress | None = None, precision: str = "fp32",
                max_interpreter_s: float | None = None, outputs: bool = True) -> dict:
    """Run the implementation ``source`` (``reference``, ``ours``/``kernel``, ``PATH.py:FN``, ... as
    ``--impl`` takes) on the dump ``dump`` and write the taps file ``out``; returns a summary.

    ``names``: taps to export (None = all); ``chunks``: half-open global chunk range, either end
    None; ``heads``: value head indices (None = all; the taps file's ``head.index``); the selection is
    the taps': ``outputs`` (the outputs and gradients, whole tensors in the dump's shapes, what ``diff``'s
    output rows and whole-tensor verdicts compare) are written whole, or not at all (False); ``overrides``:
    config values that beat the dump's. The summary's ``impl.precision`` and the file's ``precision`` say
    what was computed: the kernels' dot-operand mode (``fp32``/``bf16``), ``float64`` for the reference.
    Example: ``export_taps("d.safetensors", "t.safetensors", names=("dS",), chunks=(0, 4))``.
    """
    from kdadbg_kernels.taps import TAP_NAMES

    from .impls import check_supported, resolve_impl

    impl = resolve_impl(source, precision)
    if impl.kind == "taps file":
        raise KdadbgError(f"--source {source}: a taps file already is one; taps runs an implementation")
    names = TAP_NAMES if names is None else tuple(names)
    if not names and not outputs:
        raise KdadbgError("--no-outputs with --taps none: nothing to write (no taps, no outputs)")
    if Path(out).exists() and not force:
        raise KdadbgError(f"{out}: already exists; refusing to overwrite (use --force)")
    inputs, config = load_dump(dump, overrides, allow_nonfinite=allow_nonfinite)
    B, T = inputs.shape[:2]
    H = inputs.HV   # taps and head.index are per value head
    table = chunk_table(B, T, inputs.cu_seqlens, config.chunk_size)
    sel = resolve_selection(names, chunks, heads, table.n_chunks, H, gva=inputs.group > 1)
    dev = resolve_device(device)

    check_supported(impl, inputs, config, str(dump), dev)
    if impl.kind == "ours":
        from .impls.ours import check_tap_memory
        check_tap_memory(inputs, config, sel, dev)  # a refusal comes before any progress line
    from .progress import ticking
    from .run import interpreter_seconds, refuse_slow_interpreter

    refuse_slow_interpreter(impl, inputs, config, dev, None, max_interpreter_s, option="--source", windowed=False)
    with ticking(progress, f"{impl.name} (forward+backward)", interpreter_seconds(impl, inputs, config, dev)):
        run = impl.run(inputs, config, device=dev, taps=sel)

    lo, hi = sel.chunk_range(table.n_chunks)
    head_list = list(sel.head_list(H))
    picked = {}
    for name in sel.names:   # the rows the implementation wrote, NaN elsewhere
        if name in run.taps:
            t = run.taps[name].detach().to("cpu")
            if run.tap_chunks != list(range(lo, hi)) or run.tap_heads != head_list:
                full = torch.full((hi - lo, len(head_list), *t.shape[2:]), float("nan"), dtype=t.dtype)
                for i, c in enumerate(run.tap_chunks):
                    for j, h in enumerate(run.tap_heads):
                        full[c - lo, head_list.index(h)] = t[i, j]
                t = full
            picked[name] = t
    applies = outputs_that_apply(inputs, config) if outputs else ()
    outs = {n: run.outputs[n].detach().to("cpu") for n in applies if n in run.outputs}
    computed = "float64" if impl.kind == "reference" else impl.precision
    from .progress import beating

    with beating(progress, f"writing {out}"):
        path = write_taps_file(out, outs, picked, chunk_rows(table, lo, hi), head_list,
                               taps_metadata(impl.name, dump, config, computed, inputs=inputs), force=force)
    if progress is not None:
        progress(f"writing {out}", 1, 1)
    nonfinite = sorted(n for n, t in {**outs, **picked}.items() if not bool(torch.isfinite(t).all()))
    overflow = exp_overflow_note(nonfinite, inputs, config, table, lo, hi, picked)
    decay = None
    if impl.kind == "ours" and any(n in outs for n in nonfinite) and not nonfinite_inputs(inputs):
        # why our outputs hold NaN/Inf, as run and diff say: a 16-row block's exponent past float32's exp (the
        # reference not run here: with finite inputs every NaN/Inf of ours counts). Still exit 1
        from .run import decay_limit_note

        decay = decay_limit_note(inputs, config, table, outs, None)
    return {"overflow_note": overflow, "decay_note": decay, "nonfinite_explained": overflow is not None,
            "out": str(path), "dump": str(dump), "source": impl.name,
            "impl": {**impl.describe(), "precision": computed}, "device": dev, "config": config.as_dict(),
            "taps": list(picked), "not_provided": [n for n in sel.names if n not in picked]
            + [n for n in applies if n not in outs], "chunks": list(range(lo, hi)), "n_chunks": table.n_chunks,
            "heads": head_list, "outputs": list(applies), "nonfinite": nonfinite, "bytes": path.stat().st_size,
            "outputs_bytes": sum(t.numel() * t.element_size() for t in outs.values())}
