"""Seeded windows: run an implementation only on a range of chunks of each sequence, seeded with the
float64 reference's state entering the window (``S``) and the gradient leaving it (``dS``), and
stitch its results back into the dump's shapes, so that ``run --chunks`` and ``diff --chunks``
compare a window of a dump too long to run whole (our kernels under the Triton interpreter).

The reference does the same: :func:`seeds` walks only the states (``reference.run_states``), and the
reference compared (and the noise floor) runs on the same windows from the same seeds in float64
(:func:`reference_run`), rather than the whole reference over every chunk of the dump.

What a window can be compared on: its tokens' outputs and gradients (exactly the full run's, since
the seeds are exact), its taps, ``ht`` where the window ends its sequence and ``dh0`` where it starts
it. ``dA_log``/``ddt_bias`` sum over every chunk, so a window's are not comparable: not provided.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdadbg_kernels.taps import TapSelection

from .chunks import ChunkTable
from .compare import ChunkInfo
from .config import KDAConfig, KDAInputs
from .impls.base import Implementation, ImplRun
from .localise import window_inputs

WINDOW_NOT_COMPARABLE = "a window's dA_log/ddt_bias cover its chunks only: not comparable"
NO_WINDOW_ENDS = "no window ends its sequence"
NO_WINDOW_STARTS = "no window starts its sequence"
# what a window leaves out by its selection (not a shortfall of the implementation): ``run --chunks`` can
# pass without them
OUTSIDE_WINDOW = (WINDOW_NOT_COMPARABLE, NO_WINDOW_ENDS, NO_WINDOW_STARTS)


def shortfalls(not_provided: dict[str, str] | None, windowed: bool = True) -> dict[str, str]:
    """The outputs and gradients an implementation did not provide that make a verdict partial: all of
    ``not_provided`` but what a ``--chunks`` window leaves out by itself (``windowed``) and what the captured
    call never asked for (``dump.NOT_ASKED``). The one rule for ``run`` and ``diff``."""
    from .dump import NOT_ASKED

    return {n: why for n, why in (not_provided or {}).items()
            if not (windowed and why in OUTSIDE_WINDOW) and why != NOT_ASKED}


@dataclass(frozen=True)
class Window:
    seq: int
    first: int        # global chunk ids, inclusive
    last: int


def plan(info: ChunkInfo, lo: int, hi: int) -> list[Window]:
    """One window per sequence that has chunks in ``[lo, hi)``."""
    out = []
    for n in sorted({info.seq[c] for c in range(lo, hi)}):
        ids = [c for c in info.seq_chunks(n) if lo <= c < hi]
        out.append(Window(n, ids[0], ids[-1]))
    return out


def token_positions(inputs: KDAInputs, info: ChunkInfo, w: Window) -> torch.Tensor:
    """Flattened ``B*T`` token indices of a window's tokens."""
    T = inputs.shape[1]
    t0 = info.start[w.first] if inputs.cu_seqlens is not None else w.seq * T + info.start[w.first]
    n = sum(info.length[c] for c in range(w.first, w.last + 1))
    return torch.arange(t0, t0 + n)


def sequence_inputs(inputs: KDAInputs, info: ChunkInfo, n: int) -> KDAInputs:
    """Sequence ``n`` of a dump as a single-sequence dump (its own ``h0``, ``dht``)."""
    B, T = inputs.shape[:2]
    ids = info.seq_chunks(n)
    t0 = info.start[ids[0]] if inputs.cu_seqlens is not None else n * T
    length = sum(info.length[c] for c in ids)

    def tok(x):
        return x.reshape(B * T, *x.shape[2:])[t0:t0 + length].unsqueeze(0)

    def one(x):
        return None if x is None else x[n:n + 1]

    return KDAInputs(q=tok(inputs.q), k=tok(inputs.k), v=tok(inputs.v), g=tok(inputs.g), beta=tok(inputs.beta),
                     do=tok(inputs.do), dht=one(inputs.dht), h0=one(inputs.h0), cu_seqlens=None, A_log=inputs.A_log,
                     dt_bias=inputs.dt_bias)


def seeds(inputs: KDAInputs, config: KDAConfig, info: ChunkInfo, lo: int, hi: int, device: str = "cpu",
          progress=None) -> dict[str, torch.Tensor]:
    """The float64 reference's ``S`` and ``dS`` a window of ``[lo, hi)`` needs, walking only the states
    of the sequences holding a window (``reference.run_states``): ``S`` of every chunk of those sequences
    (a later ``dS`` needs their forward), ``dS`` of the chunks after each window. Chunk-major
    ``[n_chunks, HV, K, V]`` in math layout, NaN where nothing was walked."""
    from .reference import run_states

    K, V = inputs.shape[3:]
    shape = (len(info.seq), inputs.HV, K, V)   # every chunk of the dump
    out = {n: torch.full(shape, float("nan"), dtype=torch.float64) for n in ("S", "dS")}
    windows = plan(info, lo, hi)
    for i, w in enumerate(windows):
        ids = info.seq_chunks(w.seq)
        base, end = ids[0], ids[-1]
        backward = w.last < end
        label = "reference seeds" + (f" {i + 1}/{len(windows)} (sequence {w.seq})" if len(windows) > 1 else "")
        st = run_states(sequence_inputs(inputs, info, w.seq), config, fwd_until=w.first - base + 1,
                        bwd_until=w.last + 1 - base if backward else None, device=device, progress=progress,
                        label=label)
        for name, t in st.items():
            out[name][base:end + 1] = t.cpu()
    return out


def reference_run(inputs: KDAInputs, config: KDAConfig, seeded: dict, info: ChunkInfo, ct: ChunkTable, lo: int,
                  hi: int, device: str, taps: TapSelection | None = None, dtype: torch.dtype = torch.float64,
                  dot_dtype: torch.dtype | None = None, name: str = "reference", progress=None,
                  upstream: dict | None = None) -> ImplRun:
    """The chunked reference (``dtype``, ``dot_dtype``: the noise floor's float32 model) on the windows of
    ``[lo, hi)`` from :func:`seeds`, stitched like :func:`seeded_run`; the seeds enter in float64.
    ``name`` labels its progress; ``upstream``: the implementation's ``ImplRun.upstream``, whose 16-bit ``dht``
    seeds the reference receives as the implementation did (``localise.window_inputs``)."""
    from .impls.reference import Reference

    ref = Reference(dtype=dtype, dot_dtype=dot_dtype)
    ref.name = name
    run, _ = seeded_run(ref, inputs, config, seeded, info, ct, lo, hi, device, taps=taps, progress=progress,
                        seed_dtype=torch.float64, upstream=upstream)
    return run


def seeded_run(impl: Implementation, inputs: KDAInputs, config: KDAConfig, ref_taps: dict, info: ChunkInfo,
               ct: ChunkTable, lo: int, hi: int, device: str, taps: TapSelection | None = None, progress=None,
               seed_dtype: torch.dtype = torch.float32, upstream: dict | None = None) -> tuple[ImplRun, dict]:
    """Run ``impl`` on the windows of ``[lo, hi)`` (``ref_taps`` holds the reference's ``S`` entering and
    ``dS`` leaving each window, :func:`seeds`) and stitch: outputs in the dump's shapes, NaN outside the
    windows; taps for chunks ``lo..hi-1``. Stitched float32 (float64 where ``impl`` gives float64).

    Returns ``(run, masks)``; ``masks``: ``tokens`` [B*T] bool (tokens inside a window), ``ht`` / ``dh0``
    [N] bool (sequences whose window ends / starts them)."""
    B, T, H, K, V = inputs.shape
    N = inputs.n_seqs
    windows = plan(info, lo, hi)
    tok_mask = torch.zeros(B * T, dtype=torch.bool)
    ht_mask, dh0_mask = torch.zeros(N, dtype=torch.bool), torch.zeros(N, dtype=torch.bool)
    outs: dict[str, torch.Tensor] = {}
    heads = list(taps.head_list(inputs.HV)) if taps is not None else []   # taps are per value head
    stitched_taps: dict[str, torch.Tensor] = {}
    notes, not_provided, received = [], {}, {}
    from .progress import ticking
    from .run import interpreter_seconds

    for i, w in enumerate(windows):
        w_in = window_inputs(inputs, config, ref_taps, info, w.first, w.last, seed_dtype, upstream)
        nwc = w.last - w.first + 1
        sel = None if taps is None else TapSelection(names=taps.names, chunks=(0, nwc), heads=tuple(heads))
        stage = f"{impl.name} on window {i + 1}/{len(windows)} (chunks {w.first}-{w.last})"
        with ticking(progress, stage, interpreter_seconds(impl, w_in, config, device)):
            run = impl.run(w_in, config, device=device, taps=sel)
        notes += [n for n in run.notes if n not in notes]
        not_provided.update(run.not_provided)
        received.update(run.upstream)
        pos = token_positions(inputs, info, w)
        tok_mask[pos] = True
        for name, t in run.outputs.items():
            t = t.detach()
            if name in ("dA_log", "ddt_bias") or (name == "dh0" and inputs.h0 is None):
                continue   # (a window always has an h0, the seed; a dump without one has no dh0)
            if name not in outs:
                full = {"ht": (N, *t.shape[1:]), "dh0": (N, *t.shape[1:])}.get(name, (B * T, *t.shape[2:]))
                outs[name] = torch.full(full, float("nan"), dtype=_stitched(t))
            if name in ("ht", "dh0"):
                keep = (w.last == info.seq_chunks(w.seq)[-1]) if name == "ht" else (info.t[w.first] == 0)
                if keep:
                    outs[name][w.seq] = t[0].to("cpu", _stitched(t))
                    (ht_mask if name == "ht" else dh0_mask)[w.seq] = True
            else:
                outs[name][pos] = t.reshape(-1, *t.shape[2:]).to("cpu", _stitched(t))
        for name, t in run.taps.items():
            if name not in stitched_taps:
                stitched_taps[name] = torch.full((hi - lo, len(run.tap_heads), *t.shape[2:]), float("nan"),
                                                 dtype=_stitched(t))
            for j, c in enumerate(run.tap_chunks):
                stitched_taps[name][w.first + c - lo] = t[j].to("cpu", _stitched(t))
        tap_heads = run.tap_heads
    HV = inputs.HV   # GVA: dq, dk per q/k head, the rest per value head
    shapes = {"o": (B, T, HV, V), "dq": (B, T, H, K), "dk": (B, T, H, K), "dv": (B, T, HV, V), "dg": (B, T, HV, K),
              "dbeta": (B, T, HV)}
    outputs = {n: (t.reshape(shapes[n]) if n in shapes else t) for n, t in outs.items()}
    for n in ("ht", "dh0"):
        if n in outputs and not bool((ht_mask if n == "ht" else dh0_mask).any()):
            del outputs[n]
            not_provided[n] = NO_WINDOW_ENDS if n == "ht" else NO_WINDOW_STARTS
    for n in ("dA_log", "ddt_bias"):
        if config.gate != "none":
            not_provided[n] = WINDOW_NOT_COMPARABLE
    # what the window itself leaves out (not what the implementation did not provide), in the outputs' order
    outside = [n for n in ("ht", "dh0", "dA_log", "ddt_bias") if not_provided.get(n) in OUTSIDE_WINDOW]
    notes.append(f"chunks {lo}:{hi}: {impl.name} ran on {len(windows)} window(s) only, seeded with the float64 "
                 f"reference's S entering and dS leaving each, each window a sequence of its own: an error tied to "
                 f"absolute token positions (an offset or padding bug) or carried in from outside the window is "
                 f"not in this run; a whole run (no --chunks, or diff --full-run) has it"
                 + (f"; not compared in a window: {', '.join(outside)} "
                    f"({'; '.join(sorted({not_provided[n] for n in outside}))})" if outside else ""))
    run = ImplRun(outputs, stitched_taps, list(range(lo, hi)) if stitched_taps else [],
                  tap_heads if stitched_taps else [], not_provided, notes, upstream=received)
    return run, {"tokens": tok_mask, "ht": ht_mask, "dh0": dh0_mask}


def _stitched(t: torch.Tensor) -> torch.dtype:
    """The dtype windows are stitched in: the implementation's own where it is 16 bits (the values exactly, and
    the 16-bit storage rule of ``run.judged`` still applies: float32 copies read as FAIL at fp32) or float64,
    else float32."""
    return t.dtype if t.dtype in (torch.float64, torch.bfloat16, torch.float16) else torch.float32
