"""``kdadbg run``: an implementation (``--impl``, default our kernels) forward + backward and the float64
reference on the same inputs, compared tensor by tensor (the one metric of :mod:`kdadbg.compare`).
What the implementation does not provide (a forward-only one's gradients) is listed as not provided,
never passed; an implementation that provides nothing comparable is an error."""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .compare import Compare, compare, nan_positions_agree, nonfinite_inputs, nonfinite_note
from .compare.result import knob_overrides
from .config import KDAConfig, KDAInputs
from .dump import blind_gradients
from .errors import KdadbgError
from .fileio import atomic_save, kdadbg_version
from .impls import Implementation, as_implementation, check_supported
from .impls.base import as_received, received_note
from .diffnotes import transposed_states_note
from .progress import ticking
from .reach import blank, nonfinite_reach, reach_note
from .schema import RUN_JSON
from .tapsfile import inputs_fingerprint, outputs_that_apply
from .tolerances import tolerances

Progress = Callable[[str, int, int], None]


@dataclass
class RunResult:
    dump: str
    precision: str
    device: str
    config: KDAConfig
    tensors: list[Compare]
    timings: dict[str, float] = field(default_factory=dict)
    impl: dict = field(default_factory=dict)
    not_provided: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    nonfinite_inputs: dict | None = None    # {"tensors": {...}, "agree": bool} with --allow-nonfinite
    window: list[int] | None = None         # [lo, hi): the chunks the implementation ran on (--chunks)
    knobs: dict[str, str] = field(default_factory=knob_overrides)  # KDADBG_* knob overrides in effect

    @property
    def verdict(self) -> str:
        """``fail``: a tensor over its tolerance (or NaN/Inf inputs where the two sides disagree);
        ``not_compared``: no element of any tensor compared (exit 2); ``partial``: nothing failed, but an
        output or gradient was not provided, or a tensor compared no element (exit 3: not a full pass);
        ``pass``: every output and gradient compared and within tolerance (or UNREP). What a ``--chunks``
        window leaves out by itself (``window.OUTSIDE_WINDOW``) does not make a run partial."""
        if self.nonfinite_inputs is not None and not self.nonfinite_inputs["agree"]:
            return "fail"
        if any(t.failed for t in self.tensors):
            return "fail"
        if not any(t.compared for t in self.tensors):
            return "not_compared"
        if self.not_compared or self.missing:
            return "partial"
        return "pass"

    @property
    def passed(self) -> bool:
        """A full pass only (``verdict == "pass"``)."""
        return self.verdict == "pass"

    @property
    def missing(self) -> dict[str, str]:
        """``not_provided`` less what a ``--chunks`` window leaves out by its selection."""
        from .window import shortfalls

        return shortfalls(self.not_provided, windowed=self.window is not None)

    @property
    def applying(self) -> int:
        """How many outputs and gradients apply to the dump (what a --chunks window leaves out by itself
        aside): those compared or judged, and those not provided or not comparable (no upstream gradient)."""
        return len(self.tensors) + len(self.missing)

    @property
    def not_compared(self) -> list[Compare]:
        """Tensors of which no element was compared (NaN/Inf on both sides everywhere)."""
        return [t for t in self.tensors if not t.compared]

    @property
    def elements(self) -> int:
        return sum(t.count for t in self.tensors)

    def as_json(self) -> dict:
        """The ``--json`` document (schema ``RUN_JSON``, documented in the README)."""
        return {
            "schema": RUN_JSON,
            "verdict": self.verdict,
            "dump": self.dump,
            "impl": self.impl,
            "precision": self.precision,
            "device": self.device,
            "tensors": [{"name": t.name, "shape": list(t.shape),
                         "max_abs": finite_or_none(t.max_abs) if t.compared else None,
                         "max_index": list(t.max_index) if t.compared else None,
                         "ratio": finite_or_none(t.ratio) if t.compared else None,
                         "cosine": finite_or_none(t.cosine) if t.cosine_defined else None, "count": t.count,
                         "nonfinite": t.nonfinite, "tol": t.tol, "pass": t.passed, "unrep": t.unrep,
                         "carried_in_from_dg": carried_json(t), "sum_not_checkable": t.sum_unchecked,
                         "sum_wrong": t.sum_wrong, "precision_floor": finite_or_none(t.precision_floor)
                         if t.precision_floor is not None else None, "coherent": t.coherent,
                         "scale": t.scale if t.compared else None,
                         "abs_floor": t.abs_floor if t.compared else None, **({"reason": t.reason} if t.reason else {})}
                        for t in self.tensors],
            "compared": {"tensors": sum(t.compared for t in self.tensors), "elements": self.elements,
                         "not_compared": [t.name for t in self.not_compared]},
            "not_provided": self.not_provided,
            "nonfinite_inputs": self.nonfinite_inputs,
            "window": self.window,
            "notes": self.notes,
            "knobs": self.knobs,
            "config": self.config.as_dict(),
            "env": environment(self.device),
            "timings_s": self.timings,
        }


def finite_or_none(x: float) -> float | None:
    """JSON has no Infinity/NaN: non-finite figures are written as null."""
    return x if math.isfinite(x) else None


TOKEN_ROWS = ("o", "dq", "dk", "dv", "dg", "dbeta")


def nonfinite_chunks(outputs: dict, ref_outputs: dict | None, ct) -> tuple[set[int], bool]:
    """Where the implementation's outputs hold NaN/Inf the reference does not (``ref_outputs`` None: no reference
    run, every NaN/Inf counts): the chunks of those tokens (the per-token outputs and gradients), and whether some
    are in a tensor no chunk locates (``ht``, ``dh0``, the per-head gradients)."""
    idx, valid = ct.token_index()
    chunk_of = torch.full((int(idx.max()) + 1 if idx.numel() else 0,), -1, dtype=torch.long)
    chunk_of[idx[valid]] = torch.arange(ct.n_chunks)[:, None].expand_as(idx)[valid]
    chunks, elsewhere = set(), False
    for n, x in outputs.items():
        if ref_outputs is not None and n not in ref_outputs:
            continue
        bad = ~torch.isfinite(x.detach().cpu())
        if ref_outputs is not None:
            bad &= torch.isfinite(ref_outputs[n].detach().cpu())
        if not bool(bad.any()):
            continue
        if n in TOKEN_ROWS:
            tok = bad.reshape(bad.shape[0] * bad.shape[1], -1).any(-1).nonzero().flatten()
            chunks.update(int(c) for c in chunk_of[tok[tok < chunk_of.numel()]] if int(c) >= 0)
        else:
            elsewhere = True
    return chunks, elsewhere


def exp_range_note(inputs: KDAInputs, config: KDAConfig, ct, name: str, outputs: dict | None = None,
                   ref_outputs: dict | None = None) -> str | None:
    """Where the implementation's outputs hold NaN/Inf the reference does not, and the dump's gates pass
    float32's exp range in some chunk: why a float32 chunked kernel can fail there (None otherwise). With
    ``outputs`` and ``ref_outputs``, only where that NaN/Inf lies in those chunks (or in a tensor no chunk
    locates), naming the chunks the range cannot explain."""
    from .noise import EXP_LIMIT_FP32, chunks_past_exp_range
    from .render import id_ranges

    given = outputs is not None and ref_outputs is not None
    bad, elsewhere = nonfinite_chunks(outputs, ref_outputs, ct) if given else (set(), False)
    if given and not bad and not elsewhere:
        return None   # no NaN/Inf of theirs the reference lacks: nothing to explain (nor the gates activated)
    chunks = chunks_past_exp_range(inputs, config, ct)
    if not chunks:
        return None
    outside = ""
    if given:
        if bad and not bad & set(chunks) and not elsewhere:
            return None   # every NaN/Inf of theirs lies in chunks whose gates float32 holds: not that
        rest = sorted(bad - set(chunks))
        if rest:
            outside = (f"; the NaN/Inf in chunk{'s' if len(rest) > 1 else ''} {id_ranges(rest)} lies outside them, "
                       f"which this does not explain")
    return (f"NaN/Inf from --impl {name}: the dump's cumulative gate passes -{EXP_LIMIT_FP32:.1f} within chunks "
            f"{id_ranges(chunks)} (of {ct.n_chunks}), where exp(-gc) is infinite in float32: a chunked kernel "
            f"that forms it (the chunked algorithm's ki, dqd, dkd) cannot hold such gates, which may be the "
            f"cause{outside}; kdadbg diff prints the exp arguments per chunk")


BLOCK_ROWS = 16   # our kernels anchor each intra-chunk product's exponent at the first row of a 16-row block


def block_exponents(inputs: KDAInputs, config: KDAConfig, ct) -> torch.Tensor:
    """``a - gc_j`` for every row ``j`` of every 16-row block of every chunk, float64 ``[n_chunks,
    C/16, 16, HV, K]``: the exponents our kernels form, ``exp(a - gc_j)``, where each intra-chunk product
    is anchored at the block's first row ``a`` (the decay summed over the block's rows after ``a`` up to
    ``j``, negated; 0 on the anchor row and on padding). Past ``ln(max float32)`` = 88.72 it overflows."""
    from .reference import activate

    with torch.no_grad():
        gam = activate(inputs, config, torch.float64, "cpu")[1]["gam"].detach()      # [B*T, HV, K]
    idx, valid = ct.token_index()
    g = torch.where(valid[..., None, None], gam[idx], 0.0)                             # [n_chunks, C, HV, K]
    g = g.reshape(ct.n_chunks, ct.chunk_size // BLOCK_ROWS, BLOCK_ROWS, *g.shape[2:])
    g[:, :, 0] = 0.0
    return -g.cumsum(2)


def decay_limit_note(inputs: KDAInputs, config: KDAConfig, ct, outputs: dict, ref_outputs: dict | None,
                     window: tuple[int, int] | None = None) -> str | None:
    """Where our kernels' outputs hold NaN/Inf the reference does not: whether a 16-row block's exponent
    ``a - gc_j`` (:func:`block_exponents`, for the activated gate as the kernels form it) passes float32's
    exp limit 88.72. If one does, the first (chunk, block, token, head, K column) past it and its value, the
    chunks holding such blocks, and the NaN/Inf of the other chunks of those sequences as inherited through
    the state; NaN/Inf elsewhere, or with no block past the limit, is said not to be explained by it (None
    where ours has no NaN/Inf the reference lacks; ``ref_outputs`` None: no reference run). ``window``: the
    global chunks ``[lo, hi)`` a seeded run covered (``--chunks``): only their blocks can explain its NaN/Inf
    (the chunks before were the reference's)."""
    from .noise import EXP_LIMIT_FP32
    from .render import id_ranges

    bad, elsewhere = nonfinite_chunks(outputs, ref_outputs, ct)
    if not bad and not elsewhere:
        return None
    ex = block_exponents(inputs, config, ct)
    if window is not None:
        outside = torch.ones(ct.n_chunks, dtype=torch.bool)
        outside[window[0]:window[1]] = False
        ex[outside] = 0.0
    over = ex > EXP_LIMIT_FP32
    chunk_over = over.flatten(1).any(-1)                                                # [n_chunks]
    located = f" in chunk{'s' if len(bad) > 1 else ''} {id_ranges(sorted(bad))}" if bad else ""
    if not bool(chunk_over.any()):
        top = float(ex.max()) if ex.numel() else 0.0
        return (f"NaN/Inf from --impl ours{located}: no 16-row block's exponent a - gc_j reaches float32's exp "
                f"limit {EXP_LIMIT_FP32:.2f} (the largest is {top:.4g}), so our kernels' decay limit does not "
                f"explain them")
    flat = int(over.flatten().to(torch.uint8).argmax())
    c, s, r, h, k = (int(i) for i in torch.unravel_index(torch.tensor(flat), over.shape))
    seq = int(ct.seq[c])
    start = int(ct.start[c]) - int(ct.seq_bos[seq]) + s * BLOCK_ROWS
    end = start + min(BLOCK_ROWS, int(ct.length[c]) - s * BLOCK_ROWS) - 1
    of_seq = f" of sequence {seq}" if ct.n_seqs > 1 else ""
    in_chunks = [i for i in range(ct.n_chunks) if chunk_over[i]]
    first = {}                                                                         # sequence -> first chunk
    for i in in_chunks:
        first.setdefault(int(ct.seq[i]), i)
    after = sorted(i for i in bad - set(in_chunks) if int(ct.seq[i]) in first and i > first[int(ct.seq[i])])
    before = sorted(i for i in bad - set(in_chunks) if int(ct.seq[i]) in first and i < first[int(ct.seq[i])])
    rest = sorted(i for i in bad if int(ct.seq[i]) not in first)
    many = lambda ids: f"chunk{'s' if len(ids) > 1 else ''} {id_ranges(ids)}"           # noqa: E731
    return (f"NaN/Inf from --impl ours: our kernels anchor each intra-chunk product at the first row a of a "
            f"16-row block and form exp(a - gc_j) for its rows j, which overflows float32 past "
            f"{EXP_LIMIT_FP32:.2f}; first in chunk {c}, block {s} (tokens {start}-{end}"
            f"{of_seq}), at token {start + r}, head {h}, K column {k} (a - gc_j = {float(ex[c, s, r, h, k]):.4g})"
            f"; blocks past it in {many(in_chunks)}"
            + (f"; the NaN/Inf in {many(after)} after it is inherited through the state" if after else "")
            + (f"; in {many(before)} before it, through the backward's state" if before else "")
            + (f"; the NaN/Inf in {many(rest)} (sequences with no block past it) this does not explain"
               if rest else ""))


def carried_json(row: Compare) -> dict | None:
    """A tensor's ``carried_in_from_dg`` in ``run``'s and ``diff``'s JSON: ``{"ratio": the exact sum of the
    implementation's own dg against the reference, "own": the implementation's value against that sum}``, or
    None where the tensor is not carried in from ``dg``."""
    if row.carried is None:
        return None
    return {"ratio": finite_or_none(row.carried), "own": finite_or_none(row.carried_own)}


def environment(device: str) -> dict:
    import triton

    env = {"kdadbg": kdadbg_version(), "python": platform.python_version(), "torch": torch.__version__,
           "triton": triton.__version__, "device": device}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
    else:
        env["triton_interpreter"] = True
    return env


def check(inputs: KDAInputs, config: KDAConfig, *, impl=None, dump: str = "",
          precision: str = "fp32", device: str = "cpu", tol_overrides: list[str] | None = None,
          progress: Progress | None = None, save: str | None = None, force: bool = False,
          chunks: tuple[int, int] | None = None, max_interpreter_s: float | None = None) -> RunResult:
    """Run ``impl`` (default: our kernels at ``precision``) and the reference on ``inputs`` and compare
    every output and gradient the implementation provides. ``impl``: an ``Implementation``, a name or
    ``PATH.py:FUNCTION`` as ``--impl`` takes it, or a function in fla's ``chunk_kda`` convention
    (``impls.as_implementation``; a name or function is judged at ``precision``).

    ``chunks``: a half-open global chunk range: the implementation runs only on that window of each
    sequence, seeded from the reference (:mod:`kdadbg.window`), and is compared there (its tokens;
    ``ht``/``dh0`` where a window ends/starts its sequence) against the reference run on the same
    windows from the same float64 seeds. ``max_interpreter_s``: refuse up front a run of our kernels
    under the Triton interpreter estimated to take longer. ``save``: also write the implementation's
    outputs and gradients (float32).
    Example: ``check(*make_inputs(get_case("basic")), precision="bf16").passed``.
    """
    from .chunks import chunk_table
    from .reference import run_reference

    impl = as_implementation(impl, precision)
    config, config_note = impl.config_for(config)
    check_supported(impl, inputs, config, dump, device)
    B, T = inputs.shape[:2]
    ct = chunk_table(B, T, inputs.cu_seqlens, config.chunk_size)
    window = None
    if chunks is not None and impl.kind == "taps file":
        raise KdadbgError(f"--chunks with the taps file {impl.name}: a file holds one whole run, which cannot be rerun "
                          f"on a seeded window; `kdadbg diff DUMP --against FILE --chunks A:B` compares its rows of "
                          f"those chunks, `run` without --chunks the whole file")
    if chunks is not None:
        window = (max(0, chunks[0]), min(ct.n_chunks, chunks[1]))
        if window[0] >= window[1]:
            raise KdadbgError(f"--chunks {chunks[0]}:{chunks[1]}: selects no chunk; the dump has {ct.n_chunks} chunks")
    refuse_slow_interpreter(impl, inputs, config, device, None if window is None else window[1] - window[0],
                            max_interpreter_s)
    tols = tolerances(impl.precision, tol_overrides)
    if save is not None and not force:
        from pathlib import Path
        if Path(save).exists():
            raise KdadbgError(f"{save}: already exists; refusing to overwrite (use --force)")
    timings, masks = {}, None
    if window is None:
        t0 = time.perf_counter()
        with ticking(progress, f"{impl.name} (forward+backward)", interpreter_seconds(impl, inputs, config, device)):
            got = impl.run(inputs, config, device=device)
        timings[impl.name] = time.perf_counter() - t0
        # the reference takes the upstream gradient as the implementation's backward received it
        ref_inputs = as_received(inputs, got.upstream) or inputs
        t0 = time.perf_counter()
        ref = run_reference(ref_inputs, config, taps=(), device=device, progress=progress)
        timings["reference"] = time.perf_counter() - t0
    else:
        from .compare import ChunkInfo
        from .window import reference_run, seeded_run, seeds

        info = ChunkInfo.from_table(ct)
        ref_inputs = inputs
        for attempt in range(2):
            t0 = time.perf_counter()
            seeded = seeds(ref_inputs, config, info, *window, device, progress=progress)
            timings["reference"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            got, masks = seeded_run(impl, ref_inputs, config, seeded, info, ct, *window, device, progress=progress)
            timings[impl.name] = time.perf_counter() - t0
            received = as_received(inputs, got.upstream)
            if attempt or received is None:
                break
            ref_inputs = received   # seeded again from that do: the dS seeds depend on it
        t0 = time.perf_counter()
        ref = reference_run(ref_inputs, config, seeded, info, ct, *window, device, progress=progress,
                            upstream=got.upstream)
        timings["reference"] += time.perf_counter() - t0
    names = outputs_that_apply(inputs, config)
    # no upstream gradient: every gradient is 0 on both sides, which no backward can fail; not compared
    blind = blind_gradients(ref_inputs, names, inputs)   # as received: a do flushed to 0 in fp16 judges nothing
    tols16 = tolerances("bf16", tol_overrides)
    # NaN/Inf inputs: what they can reach is left out on both sides (kdadbg.reach); the rest compared as always
    # (also in --chunks windows: the reference run on them spreads its NaN as the whole run's does)
    reach = nonfinite_reach(inputs, config, ct)
    reached = reach.masks({n: t for n, t in ref.outputs.items() if n in names}) if reach is not None else {}
    outs = blank(got.outputs, reached)   # (got.outputs kept as returned: --save writes them)
    ref.outputs = blank(ref.outputs, reached)
    rows = [judged(n, outs[n], ref.outputs[n].cpu() if masks else ref.outputs[n],
                   _window_mask(n, masks, B, T, ref.outputs[n].ndim), tols[n], tols16[n])
            for n in names if n in outs and n not in blind]
    if window is None:
        carry_from_dg(rows, outs, ref.outputs, inputs, config)
    from .compare.carried import REDUCED

    # a dA_log/ddt_bias whose sum cannot be checked (carry_from_dg) has no carried-in rule: the floor's judges it,
    # at either precision (its value against the reference is what the floor measures; dg's rounding only takes
    # away the split: our bf16 op failed kimi seed 12 on a head 0 that cancels, a user trial)
    unchecked = [r for r in rows if r.failed and r.sum_unchecked is not None]
    if (impl.precision == "fp32" and any(r.failed and r.name not in REDUCED for r in rows)) or unchecked:
        # over its tolerance: is the tolerance within float32's reach on this dump? (Not in bf16 mode, whose
        # noise model rounds the products' operands only: its dg floor can be 10x what bf16 kernels reach)
        t0 = time.perf_counter()
        floor_out = blank(precision_floor_outputs(ref_inputs, config, impl.precision, device, progress,
                                                  None if window is None else (seeded, info, ct, window,
                                                                               got.upstream)), reached)
        timings["noise floor"] = time.perf_counter() - t0
        for r in rows:
            # (a tensor returned in 16 bits has the storage rule instead: bf16 mode's tolerance, judged)
            if r.failed and r.name in floor_out and r.storage is None and \
                    ((impl.precision == "fp32" and r.name not in REDUCED) or r in unchecked):
                fl = floor_out[r.name]
                ref_t = ref.outputs[r.name].cpu() if masks else ref.outputs[r.name]
                r.judge_precision(compare(r.name, fl.to(ref_t.device), ref_t,
                                          _window_mask(r.name, masks, B, T, ref_t.ndim)).ratio, impl.precision)
    not_provided = {n: blind.get(n) or got.not_provided.get(n, "not returned")
                    for n in names if n not in got.outputs or n in blind}
    if not rows:
        where = "" if window is None else f" on chunks {window[0]}:{window[1]}"
        raise KdadbgError(f"nothing to compare: --impl {impl.name} provides none of {', '.join(names)}{where}")
    received_as = received_note(impl.name, inputs, got.upstream, windows=window is not None)
    result = RunResult(dump, impl.precision, device, config, rows, timings, impl.describe(), not_provided,
                       [*([config_note] if config_note else []), *got.notes, *([received_as] if received_as else [])])
    result.window = None if window is None else list(window)
    flipped = transposed_states_note(outs, ref.outputs, {r.name for r in rows if r.failed}, tols, impl.name)
    if flipped:
        result.notes.append(flipped)
    bad_in = nonfinite_inputs(inputs)
    if bad_in:
        agree = nan_positions_agree({n: outs[n] for n in names if n in outs}, ref.outputs)
        left_out = {n: int(m.sum()) for n, m in reached.items()}
        result.nonfinite_inputs = {"tensors": bad_in, "agree": agree, "left_out": left_out}
        result.notes.append(nonfinite_note(bad_in, agree))
        if left_out:
            result.notes.append(reach_note(left_out))
    if any(r.nonfinite for r in rows):
        # ours anchors its exponents per 16-row block (any cumulative gate): only a block's own decay limits it.
        # Beside NaN/Inf inputs too (outside their reach, blanked on both sides): a layer whose gate overflows
        # makes the NaN its own do then carries back (a user trial: a capture with --when nonfinite)
        note = (decay_limit_note(inputs, config, ct, outs, ref.outputs, window) if impl.kind == "ours" else
                exp_range_note(inputs, config, ct, impl.name, outs, ref.outputs))
        if note:
            result.notes.append(note)
    if save is not None:
        # what was computed, as taps files say it: the reference in float64 (impl.precision is its tolerance table)
        meta = {"source": impl.name, "precision": "float64" if impl.kind == "reference" else impl.precision,
                "dump": dump, "kdadbg": kdadbg_version(),
                **({} if window is None else {"chunks": f"{window[0]}:{window[1]}"}), **config.to_metadata(),
                "inputs_sha256": inputs_fingerprint(inputs)}
        # a tensor returned in 16 bits keeps its dtype (its values exactly): `diff --against` the file then
        # judges it as `run` did (as one returned in 16 bits), where float32 copies read as BUG at fp32
        try:
            atomic_save({r.name: _saved(got.outputs[r.name]) for r in rows}, meta, save, force=force)
        except KdadbgError as e:  # the caller may still show the result (e.result) before the error
            e.result = result
            raise
    return result


LOW_DTYPES = (torch.bfloat16, torch.float16)


def precision_floor_outputs(inputs: KDAInputs, config: KDAConfig, precision: str, device: str, progress=None,
                            windowed: tuple | None = None) -> dict:
    """The outputs and gradients of the noise floor (the chunked reference at ``precision``, ``noise``): the
    whole dump, or with ``windowed`` = ``(seeds, info, table, (lo, hi), upstream)`` the same windows as the
    run. What ``Compare.judge_precision`` measures a failing tensor's reach against."""
    from . import noise

    if windowed is None:
        with ticking(progress, "noise floor (the reference in float32)", None):
            return noise.floor_reference(inputs, config, precision, (), device)[0]
    from .window import reference_run

    seeded, info, ct, (lo, hi), upstream = windowed
    return reference_run(inputs, config, seeded, info, ct, lo, hi, device, dtype=torch.float32,
                         dot_dtype=noise.DOT_DTYPES[precision], name="noise floor", progress=progress,
                         upstream=upstream).outputs


def _saved(t: torch.Tensor) -> torch.Tensor:
    """An output as ``run --save`` writes it: in its own dtype if 16 bits, else float32."""
    t = t.detach().cpu()
    return t if t.dtype in LOW_DTYPES else t.float()


def judged(name: str, x: torch.Tensor, ref: torch.Tensor, mask, tol: float, tol16: float,
           dtype: torch.dtype | None = None) -> Compare:
    """``x`` against ``ref`` at ``tol``; a tensor returned in 16 bits (``dtype``, default ``x``'s own: ``diff``
    passes its float64 rows' original dtype) that fails where the reference rounded to that dtype fails too is
    judged at bf16 mode's ``tol16`` instead, UNREP within it (``Compare.judge_storage``)."""
    dtype = x.dtype if dtype is None else dtype
    row = compare(name, x, ref, mask).judge(tol)
    if not row.passed and dtype in LOW_DTYPES:
        row.judge_storage(dtype, compare(name, ref.to(dtype).to(ref.dtype), ref, mask).ratio, tol16)
    return row


def carry_from_dg(rows: list, outputs: dict, ref: dict, inputs: KDAInputs, config: KDAConfig) -> None:
    """``diff``'s carried-in rule (``compare.carried``) for whole tensors: ``dA_log`` and ``ddt_bias`` are
    sums of ``dg`` over a head's tokens, so where the gate gradient cancels ``dg`` within its bar can put them
    over theirs (our bf16 kernels' ``dA_log`` 0.0121 against 1e-2 on the CI-size ``kimi`` dump). Such a row
    over its tolerance whose every head over it is within the tolerance (or float32's rounding of the sum) of the
    exact float64 sum of the implementation's own ``dg`` is carried in from ``dg`` (``Compare.carried``, with the
    worst such head's ``carried_own``): not a failure; ``dg`` is judged on its own row. A head beyond that, and
    beyond the reach of ``dg``'s 16-bit rounding where ``dg`` came back so, is a wrong reduction (``sum_wrong``,
    still failing), one within that reach not checkable (``sum_unchecked``: the noise floor judges it, ``check``),
    and one whose ``dg`` error sums coherently (``compare.carried.COHERENT``: a bias in ``dg``, not its rounding;
    at either precision) is not carried in (``coherent``)."""
    from .compare.carried import (COHERENT, REDUCED, coherence, head_fields, head_split, low_dtype, reductions_of,
                                  terms)

    by = {r.name: r for r in rows}
    if config.gate == "none" or "dg" not in outputs or inputs.dt_bias is None:
        return
    formed = sums = coh = None   # dg's terms and their exact sums, formed once for both quantities
    for n in REDUCED:
        r = by.get(n)
        if r is None or r.passed is not False or r.unrep or n not in outputs:
            continue
        if formed is None:
            formed = terms(outputs["dg"], inputs, config)
            sums = reductions_of(outputs["dg"], inputs, config, formed)
        exact = sums[n].reshape(outputs[n].shape)
        own = compare(n, outputs[n].detach().cpu(), exact)
        if "dg" in ref:
            coh = coh if coh is not None else coherence(outputs["dg"], ref["dg"], inputs, config)   # both sums at once
            c = float(torch.nan_to_num(coh[n], nan=0.0).max())
            if c > COHERENT:
                r.coherent = c
                continue
        if not own.compared or not math.isfinite(own.ratio):
            continue
        # head by head, as diff's cells: the heads over their tolerance (a head within it is not what failed)
        heads = head_split(n, outputs[n], ref[n], outputs, inputs, config, r.tol, formed)
        over = [d for d in heads if d["ratio"] > r.tol]
        wrong = [d for d in over if d["own"] > d["reach"]]
        carried = (lambda: compare(n, exact, ref[n].detach().cpu().reshape(exact.shape)).ratio)   # noqa: E731
        if over and all(d["own"] <= d["bar"] for d in over):   # every one's sum right: carried in from dg
            r.carried = carried()
            r.carried_own = max(d["own"] for d in over)
        elif wrong:   # beyond a head's reach: a wrong sum (FAIL), a line says where
            r.sum_wrong = {"dtype": low_dtype(outputs) if wrong[0]["stored"] else None, "heads": head_fields(wrong)}
        elif over:   # within the reach of dg's 16-bit rounding: the noise floor's rule judges it then (check)
            r.sum_unchecked = {"dtype": low_dtype(outputs), "carried": carried(),
                               "own": own.ratio, "heads": head_fields(d for d in over if d["own"] > d["bar"])}


def _window_mask(name: str, masks: dict | None, B: int, T: int, ndim: int):
    """The elements of output ``name`` a seeded window compared (None: a whole run, every element)."""
    if masks is None:
        return None
    if name in ("ht", "dh0"):
        return masks[name].reshape(-1, *([1] * (ndim - 1)))
    return masks["tokens"].reshape(B, T, *([1] * (ndim - 2)))


def _interpreter_estimator(impl: Implementation, device: str):
    """What estimates ``impl``'s time under the Triton interpreter (our kernels, fla's), None for anything
    else or on a GPU."""
    if device != "cpu":
        return None
    if impl.kind == "ours":
        from .impls.ours import interpreter_estimate
        precision = getattr(impl, "precision", "fp32")   # bf16 mode runs 1.5-2x fp32's time there
        return lambda inputs, config, n_chunks=None: interpreter_estimate(inputs, config, n_chunks, precision)
    if impl.kind == "fla":
        from .impls.fla import interpreter_estimate
        return interpreter_estimate
    return None


def interpreter_seconds(impl: Implementation, inputs: KDAInputs, config: KDAConfig, device: str,
                        n_chunks: int | None = None) -> float | None:
    """The estimated seconds of our kernels or fla's under the Triton interpreter, None for anything else."""
    estimate = _interpreter_estimator(impl, device)
    return None if estimate is None else estimate(inputs, config, n_chunks)[0]


def refuse_slow_interpreter(impl: Implementation, inputs: KDAInputs, config: KDAConfig, device: str,
                            n_chunks: int | None, max_s: float | None, option: str = "--impl",
                            windowed: bool = True) -> None:
    """One line, before any work, when our kernels (or fla's) under the Triton interpreter would take more
    than ``max_s`` seconds by the measured rate (:func:`kdadbg.impls.ours.interpreter_estimate`,
    :func:`kdadbg.impls.fla.interpreter_estimate`). ``option``: the command's name for the implementation
    (``taps``: ``--source``); ``windowed``: whether the command's ``--chunks`` runs a window (``taps``' picks
    the taps exported from a whole run)."""
    if max_s is not None and not max_s >= 0:
        raise KdadbgError(f"--max-interpreter-s: expected seconds, 0 or more, found {max_s:g}")
    estimate = _interpreter_estimator(impl, device)
    if max_s is None or estimate is None:
        return
    est, how = estimate(inputs, config, n_chunks)
    if est > max_s:
        window = ("a chunk window (--chunks A:B)" if windowed else
                  "a chunk window of run or diff (here --chunks picks the taps exported, from a run over every "
                  "chunk)")
        raise KdadbgError(f"{option} {impl.name} under the Triton interpreter (no GPU): estimated {est:.0f} s ({how}), "
                          f"over --max-interpreter-s {max_s:g}; use --device cuda, another {option} (e.g. reference), "
                          f"{window}, or raise --max-interpreter-s")
