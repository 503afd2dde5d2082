"""``kdadbg diff``: where does an implementation first leave the float64 reference, per quantity ×
chunk × head?

The flow, the same for every implementation (``--impl``; ``--against FILE`` is the implementation "a
taps file")::

    dump -> inputs -> impl.run    -> (outputs, gradients, taps?) ┐
                      reference   -> (outputs, gradients, taps)  ┴-> cells (per chunk) -> localise

Compared per chunk × head (:mod:`kdadbg.compare`): every tap the implementation provides, and its
outputs and gradients cut into per-chunk rows (``o``, ``dq``, ``dk``, ``dv``, ``dg``, ``dbeta``), per
sequence (``ht``, ``dh0``) and per head (``dA_log``, ``ddt_bias``), in float64 over the valid elements.
A cell over its tolerance is DRIFT or BUG against the noise floor (:mod:`kdadbg.noise`); a tap float32
cannot hold is UNREP. The first divergence is the first cell over its tolerance in dataflow order
(:func:`kdadbg.compare.dataflow_key`); a comparison of nothing is an error, never a pass.
``diff_taps_files(a, b)`` compares two taps files, ``a`` playing the reference, without a dump.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import math
from typing import Callable

import torch

from kdadbg_kernels.taps import TAP_NAMES, TapSelection

from . import noise
from .chunks import chunk_table
from .compare.carried import (REDUCED, carried_from_dg, carried_in, head_fields, heads_text, low_dtype,
                              unchecked_hint, unchecked_in, wrong_sums)
from .compare.cells import within_tolerance_sum
from .compare import (ORDER, ROW_NAMES, ChunkInfo, DiffResult, compare, compare_cells, nan_positions_agree,
                      nonfinite_inputs, nonfinite_note, output_rows, unrepresentable)
from .config import KDAConfig, KDAInputs
from .errors import KdadbgError
from .impls import TapsSpec, as_implementation, check_supported, resolve_impl
from .impls.base import as_received, convert_taps, received_note, rounding_bound, stored_as
from .localise import all_nan, amplification, exponent_ranges, repeat_report, select, window_rerun
from .diffnotes import (carried_seed, convention_notes, decay_coverage_note, negated_note, precision_hint,
                        transposed_states_note, written_nowhere)
from .dump import blind_gradients
from .reach import blank, nonfinite_reach, reach_note
from .tapsfile import OUTPUT_NAMES
from .run import LOW_DTYPES, carried_json, decay_limit_note, exp_range_note, judged as judged_tensor
from .tolerances import tap_tolerances, tolerances

Progress = Callable[[str, int, int], None]


_BEATS: contextvars.ContextVar[list | None] = contextvars.ContextVar("kdadbg_diff_beats", default=None)


def _stops_heartbeats(fn):
    """``fn``'s stage heartbeats (``_stages``) stop when it returns or raises, whatever stage it was in."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        token = _BEATS.set([])
        try:
            return fn(*args, **kwargs)
        finally:
            for beat in _BEATS.get():
                beat.stop()
            _BEATS.reset(token)
    return wrapper


def _stages(progress: Progress | None):
    """One bar per stage: starting the next completes the previous; a stage's elapsed time shows while it
    runs (``progress.Heartbeat``, stopped with the stage or when the diff ends: ``_stops_heartbeats``)."""
    from .progress import Heartbeat

    stages: list[tuple[str, Heartbeat]] = []

    def step(stage: str | None):
        """Complete the current stage and start ``stage`` (None: start nothing)."""
        if progress:
            if stages:
                name, beat = stages.pop()
                beat.stop()
                progress(name, 1, 1)
            if stage is not None:
                beat = Heartbeat(progress, stage)
                stages.append((stage, beat))
                if _BEATS.get() is not None:
                    _BEATS.get().append(beat)
    return step


def _spans(ct, chunks: list[int]) -> tuple[list[int], list[int]]:
    """Each chunk's first flattened token and valid rows (``reach.Reach.tap_masks``)."""
    return [int(ct.start[c]) for c in chunks], [int(ct.length[c]) for c in chunks]


def cell_tolerances(precision: str, tol_overrides) -> dict[str, float]:
    """Taps: the tap table; output rows: the whole-tensor table (``--tol`` names either)."""
    taps = [t for t in tol_overrides or () if t.partition("=")[0].strip() not in ROW_NAMES]
    rows = [t for t in tol_overrides or () if t.partition("=")[0].strip() in ROW_NAMES]
    return {**tap_tolerances(precision, taps), **tolerances(precision, rows)}


@_stops_heartbeats
def diff_dump(inputs: KDAInputs, config: KDAConfig, impl=None, *, dump: str | None = None,
              device: str = "cpu", names: tuple[str, ...] = TAP_NAMES, chunks: tuple[int, int] | None = None,
              heads: tuple[int, ...] | None = None, tol_overrides: list[str] | None = None,
              noise_floor: bool = True, window: int = 3, repeat: int = 1, drift_fails: bool = False,
              seeded: bool = False, max_interpreter_s: float | None = None,
              progress: Progress | None = None) -> DiffResult:
    """Diff implementation ``impl`` (default: our kernels in fp32 mode) against the float64 reference.

    Args:
        inputs, config: a loaded dump (``kdadbg.dump.load_dump``).
        impl: an :class:`kdadbg.impls.Implementation` (``resolve_impl("ours", "bf16")``, a taps file, ...),
            a name or ``PATH.py:FUNCTION`` as ``--impl`` takes it, or a function in fla's ``chunk_kda``
            convention (those two at fp32); its ``precision`` picks the tolerances and the noise floor.
        names: taps to compare; chunks: half-open global chunk range (None: all); heads: value heads
            (None: all); with GVA the dq/dk rows compared are those of the q/k heads they read.
        noise_floor: label failing cells DRIFT or BUG against the float32 reference (see ``noise``).
        window: chunks in the made-here-or-carried-in rerun (0 skips it).
        repeat: run the implementation this many times and report the first tap × chunk whose bits differ.
        drift_fails: whether a DRIFT cell fails the verdict too (a BUG always does).
        seeded: run the implementation only on ``chunks`` of each sequence, seeded from the reference
            (:mod:`kdadbg.window`), and the reference and the noise floor on the same windows; otherwise
            everything runs on the whole dump and ``chunks`` selects the cells.
        max_interpreter_s: refuse up front our kernels under the Triton interpreter estimated slower.
    Example:
        >>> inputs, config = load_dump("sample_inputs/basic.safetensors")
        >>> res = diff_dump(inputs, config, resolve_impl("ours", "fp32"))
        >>> res.first_divergence   # None, or {"tap": "dL", "chunk": 3, "head": 0, ...}
    """
    from .reference import run_reference

    from .progress import ticking
    from .run import interpreter_seconds, refuse_slow_interpreter
    from .window import reference_run, seeded_run, seeds

    impl = as_implementation(impl)
    precision = impl.precision
    config, config_note = impl.config_for(config)
    check_supported(impl, inputs, config, dump or "", device)
    tols = cell_tolerances(precision, tol_overrides)
    B, T = inputs.shape[:2]
    G = inputs.group
    ct = chunk_table(B, T, inputs.cu_seqlens, config.chunk_size)
    info = ChunkInfo.from_table(ct)
    lo, hi = (0, ct.n_chunks) if chunks is None else (max(0, chunks[0]), min(ct.n_chunks, chunks[1]))
    seeded = seeded and (lo, hi) != (0, ct.n_chunks)
    refuse_slow_interpreter(impl, inputs, config, device, (hi - lo) * max(1, repeat) if seeded else None,
                            max_interpreter_s)
    head_list = list(range(inputs.HV)) if heads is None else list(heads)
    chunk_list = list(range(lo, hi))
    sel = TapSelection(names=tuple(names), chunks=(lo, hi), heads=tuple(head_list))
    missing = {"taps": [], "chunks": [], "heads": [], "not_written": [], "not_in_reference_file": []}
    step = _stages(progress)

    def impl_runs(inp: KDAInputs, states: dict | None) -> list:
        runs = []
        for i in range(max(1, repeat)):
            stage = f"{impl.name} run {i + 1}" if repeat > 1 else impl.name
            step(None)
            if seeded:
                runs.append(seeded_run(impl, inp, config, states, info, ct, lo, hi, device, taps=sel,
                                       progress=progress)[0])
            else:
                with ticking(progress, stage, interpreter_seconds(impl, inp, config, device)):
                    runs.append(impl.run(inp, config, device=device, taps=sel))
        return runs

    # the implementation first: the reference and the noise floor take the upstream gradient as its backward
    # received it (impls.base.as_received: do rounded to a 16-bit o's dtype), seeded windows seeded from that
    states = None
    if seeded:
        step("reference seeds")
        states = seeds(inputs, config, info, lo, hi, device, progress=progress)
    runs = impl_runs(inputs, states)
    dump_inputs, received = inputs, as_received(inputs, runs[0].upstream)
    if received is not None:
        inputs = received
        if seeded:
            step("reference seeds, from the upstream gradient as received")
            states = seeds(inputs, config, info, lo, hi, device, progress=progress)
            runs = impl_runs(inputs, states)
    run = runs[0]
    step("reference")
    ref_names = tuple(dict.fromkeys((*names, "gc", "gT", "S", "dS")))
    if seeded:   # the reference on the windows alone, from its seeds; its taps' row 0 is chunk lo
        ref = reference_run(inputs, config, states, info, ct, lo, hi, device, taps=TapSelection(names=ref_names),
                            progress=progress, upstream=run.upstream)
        ref_taps, base = dict(ref.taps), lo
        for n in ("S", "dS"):
            states[n][lo:hi] = ref_taps[n]
    else:
        ref = run_reference(inputs, config, taps=ref_names, device=device)
        ref_taps, base = dict(ref.taps), 0
        states = ref_taps
    exp_taps = ref_taps
    # NaN/Inf inputs: what they can reach is left out on both sides (kdadbg.reach), the rest compared as always;
    # the window rerun's seeds (states) and the exponents keep the reference's own values. Seeded windows too: the
    # reach is the whole dump's, a bound for any window of it (a window's seeds carry the reference's NaN in)
    reach = nonfinite_reach(inputs, config, ct)
    reached, reached_taps = {}, {}   # (the reference's tap layout: every chunk, or the window's, every value head;
    if reach is not None:            # the floor's too)
        reached = reach.masks(ref.outputs)
        if seeded:   # of the token-major tensors only the windows' tokens are compared (and counted as left out)
            win = torch.zeros(B * T, dtype=torch.bool)
            for c in range(lo, hi):
                win[int(ct.start[c]):int(ct.start[c]) + int(ct.length[c])] = True
            reached = {n: m & win.view(B, T, *([1] * (m.ndim - 2))).to(m.device) if m.ndim >= 3 else m
                       for n, m in reached.items()}
            reached = {n: m for n, m in reached.items() if bool(m.any())}
        ref.outputs = blank(ref.outputs, reached)
        ref_chunks = list(range(lo, hi)) if seeded else list(range(ct.n_chunks))
        reached_taps = reach.tap_masks(ref_taps, *_spans(ct, ref_chunks), list(range(inputs.HV)))
        ref_taps = blank(ref_taps, reached_taps)
        run = dataclasses.replace(run, outputs=blank(run.outputs, reached), taps=blank(run.taps, reach.tap_masks(
            run.taps, *_spans(ct, run.tap_chunks), run.tap_heads)))

    cand = {}
    for n in names:
        t = run.taps.get(n)
        if t is None:
            missing["taps"].append(n)
        else:
            # all NaN where the reference is not: a buffer no kernel wrote (they start NaN-filled so that it
            # shows), or NaN written; either way compared, so that its cells fail as non-finite, and named
            if all_nan(t) and not all_nan(ref_taps[n]):   # (NaN inputs can make both sides NaN)
                missing["not_written"].append(n)
            cand[n] = t.detach()
    tap_rows, tap_heads = [c for c in chunk_list if c in run.tap_chunks], [h for h in head_list if h in run.tap_heads]
    if cand and impl.provides_taps:
        missing["chunks"] = [c for c in chunk_list if c not in run.tap_chunks]
        missing["heads"] = [h for h in head_list if h not in run.tap_heads]
    if not tap_rows or not tap_heads:
        cand = {}
    if cand:
        cand = select(cand, [run.tap_chunks.index(c) for c in tap_rows], [run.tap_heads.index(h) for h in tap_heads])
    if not run.taps and tuple(names) == TAP_NAMES:
        missing["taps"] = []   # an implementation without taps, all asked by default: nothing to list
    # (one that returned some, a function's forward taps say, has the others listed: a user trial)
    # (taps asked for by name are listed as not provided whatever the implementation offers)
    ref_rows = [c - base for c in tap_rows]
    ref_sel = select({n: ref_taps[n] for n in cand}, ref_rows, tap_heads)
    # the exp(-gc) taps are judged weighted by exp(gc) (metrics.exp_gc_weight): the reference's gc of their cells
    ref_gc = select({"gc": ref_taps["gc"]}, ref_rows, tap_heads)["gc"] \
        if cand and "gc" in ref_taps and any(n in noise.EXP_NEG_GC_TAPS for n in cand) else None
    # no upstream gradient (do all zero, no nonzero dht): every gradient is 0 on both sides; not compared
    blind = blind_gradients(inputs, ref.outputs, dump_inputs)
    outs = {n: t for n, t in run.outputs.items() if n in ref.outputs and n not in blind}
    # seeded windows: the stitched ht/dh0 hold the sequences a window ends/starts, which are exactly
    # those whose last/first chunk is selected, the only ones output_rows compares
    mine, row_ids = output_rows(outs, ct, config.state_layout, chunk_list, head_list, G)
    # the reference's rows of every output the selection compares (ht, dh0 only where it holds a sequence's last,
    # first chunk): each one the implementation does not return is not provided, the verdict then at best partial
    theirs, _ = output_rows(ref.outputs, ct, config.state_layout, chunk_list, head_list, G)
    expected = list(theirs)
    theirs = {n: theirs[n] for n in mine}
    if not cand and not mine:
        offered = ", ".join((*[n for n in ref.outputs], *names))
        raise KdadbgError(f"nothing to compare: --impl {impl.name} provides none of {offered} for the selection "
                          f"(chunks {lo}:{hi}, heads {','.join(map(str, head_list))})")

    def floor_run(inp, taps: tuple, rows: tuple, bound: bool = False):
        """The noise floor of ``inp`` (the dump, or noise.perturbed's second sample) for those taps and rows,
        cut as the cells are; a value stored in 16 bits cannot be nearer than its rounding: it includes it,
        and with ``bound`` such a tap's sample is joined by its worst case, ``rounding_bound`` (of the
        reference: the same for every sample)."""
        if seeded:
            fl = reference_run(inp, config, states, info, ct, lo, hi, device, taps=TapSelection(names=taps),
                               dtype=torch.float32, dot_dtype=noise.DOT_DTYPES[precision], name="noise floor",
                               upstream=run.upstream)   # its dht seeds as the reference's: as received
            fl_out, fl_taps = fl.outputs, fl.taps
        else:
            fl_out, fl_taps = noise.floor_reference(inp, config, precision, taps, device)
        fl_out, fl_taps = blank(fl_out, reached), blank(fl_taps, reached_taps)
        t = select({n: stored_as(fl_taps[n], run.tap_storage.get(n)) for n in taps}, ref_rows, tap_heads)
        if bound:
            for n, dt in run.tap_storage.items():
                if n in t:
                    t[n] = (t[n], rounding_bound(ref_sel[n], dt))
        r, _ = output_rows({n: stored_as(fl_out[n], run.outputs[n].dtype) for n in rows}, ct,
                           config.state_layout, chunk_list, head_list, G)
        return t, r

    floor_taps = floor_rows = None
    if noise_floor:
        step("noise floor")
        floor_taps, floor_rows = floor_run(inputs, tuple(cand), tuple(mine), bound=True)

    unrep = unrepresentable(ref_taps, cand, {n: tap_rows for n in cand}, tap_heads, info, base)

    # dA_log/ddt_bias split into their sum's own error and dg's (not in a window: its sums hold its chunks only)
    carried = carried_from_dg(mine, theirs, row_ids, run.outputs, inputs, config, ct, chunk_list, head_list, info,
                              tols, G, ref_dg=ref.outputs.get("dg")) \
        if noise_floor and not seeded else {}
    carried_notes = {}

    # rows returned in 16 bits and judged at fp32's tolerances: as `run` judges such a tensor, a cell its floor
    # puts out of reach is UNREP only within bf16 mode's tolerance (compare.cells.judge)
    tols16 = cell_tolerances("bf16", tol_overrides)
    storage_tols = {n: tols16[n] for n in mine if run.outputs[n].dtype in LOW_DTYPES} if precision == "fp32" else {}

    def judged():
        out = compare_cells(cand, ref_sel, {n: tap_rows for n in cand}, tap_heads, info, tols, floor_taps, unrep,
                            gc=ref_gc)
        out.update(compare_cells(mine, theirs, row_ids, head_list, info, tols, floor_rows, group=G,
                                 storage_tols=storage_tols))
        carried_notes.clear()
        carried_notes.update(carried_in(out, carried))
        return out

    cells = judged()
    failing = [n for n, c in cells.items() if bool(c.failing.any())]
    if noise_floor and failing:
        # a second floor sample where cells fail: each failing quantity's floor is the larger of two correct
        # float32 runs (noise.perturbed); a cell that is a bug stays one against both
        step("noise floor, second sample")
        taps2, rows2 = floor_run(noise.perturbed(inputs), tuple(n for n in cand if n in failing),
                                 tuple(n for n in mine if n in failing))
        for fl, second in ((floor_taps, taps2), (floor_rows, rows2)):
            for n, t in second.items():
                fl[n] = (*(fl[n] if isinstance(fl[n], tuple) else (fl[n],)), t)
        cells = judged()
    unchecked = unchecked_in(cells, carried)
    cells = {n: cells[n] for n in ORDER if n in cells}
    missing["not_written"] = written_nowhere(missing["not_written"], cells)
    res = DiffResult("impl", (impl.name, "reference"), precision, device, dump, config, info, chunk_list, head_list,
                     cells, impl=impl.describe(), drift_fails=drift_fails, missing=missing,
                     not_provided={n: blind.get(n) or run.not_provided.get(n, "not returned") for n in expected
                                   if n not in run.outputs or n in blind},
                     taps_asked=tuple(names) != TAP_NAMES, notes=[*([config_note] if config_note else []), *run.notes,
                            *([note] if (note := received_note(impl.name, dump_inputs, run.upstream, seeded))
                              else [])])
    res.notes.extend(convention_notes(cells, cand, ref_sel, impl))
    negated = negated_note(cells, (cand, ref_sel), (mine, theirs))
    if negated:
        res.notes.append(negated)
    flipped = transposed_states_note(run.outputs, ref.outputs, {n for n in ("ht", "dh0") if n in cells and bool(
        cells[n].failing.any())}, tols, impl.name)
    if flipped:
        res.notes.append(flipped)
    from .compare.carried import COHERENT

    for n, split in carried.items():   # the coherence carried_from_dg measured
        if split.coherent is not None:
            worst = float(split.coherent.max())
            if n in cells and bool(cells[n].failing.any()) and worst > COHERENT:
                res.notes.append(f"{n}: not carried in from dg: dg's error sums into it coherently ({worst:.3g} "
                                 f"against at most {COHERENT:g} for rounding), a bias in dg that its own rows "
                                 f"cannot show, not its rounding carried in")
    for n, u in unchecked.items():
        res.notes.append(unchecked_note(n, u, run.outputs, impl.name))
    for n, wrong in wrong_sums(cells, carried).items():
        heads = heads_text(wrong, lambda d: f"head {d['head']} {d['own']:.3g} from it, beyond " + (
            f"the {d['beyond']:.3g} that rounding the returned dg can reach" if d["reach"] is not None
            else f"{d['beyond']:.3g} (its tolerance, or float32's rounding of the sum)"))
        res.notes.append(f"{n}: a wrong sum (BUG): its value against the exact sum of the implementation's own dg, "
                         f"{heads}")
    for n, r in carried_notes.items():
        res.notes.append(f"{n}: over its tolerance, carried in from dg (DRIFT, not a bug of the sum): {n} formed "
                         f"exactly from the implementation's own dg ({impl.name}) is {r:.3g} from the reference; "
                         f"dg's rows are judged on their own")
    # a sum not checkable at some head and wrong at none (no BUG cell): not a failure as a whole either
    whole = {n: (carried[n].exact, u["heads"], low_dtype(run.outputs)) for n, u in unchecked.items()
             if not bool((cells[n].label == noise.BUG).any())}
    res.tensors = tensor_verdicts(mine, theirs, row_ids, info, tols, tols16 if precision == "fp32" else None,
                                  {n: run.outputs[n].dtype for n in mine},
                                  {n: split.exact for n, split in carried.items() if split.sum_right(cells.get(n))},
                                  floor_rows, precision, unchecked=whole)
    hint = precision_hint(precision, cells, {n: run.outputs[n].dtype for n in mine}, impl.name)
    if hint:
        res.notes.append(hint)
    if impl.kind == "taps file":
        res.files = {"theirs": impl.path, "state_layout": impl.spec.state_layout, "gate_units": impl.spec.gate_units}
    bad_in = nonfinite_inputs(inputs)
    if bad_in:
        agree = nan_positions_agree(run.outputs, ref.outputs)
        left_out = {n: int(m.sum()) for n, m in reached.items()}
        res.nonfinite_inputs = {"tensors": bad_in, "agree": agree, "left_out": left_out}
        res.notes.append(nonfinite_note(bad_in, agree))
        if left_out:
            res.notes.append(reach_note(left_out))
    # NaN/Inf in the implementation's outputs the reference lacks (outside any input NaN's reach): whether the
    # gates explain them, as `run` says (ours: a 16-row block's exponent past float32's exp, in the window's chunks
    # where it ran on one; otherwise a chunk's); else a first divergence of NaN reads as a bug to hunt (a user trial)
    why = (decay_limit_note(inputs, config, ct, run.outputs, ref.outputs, (lo, hi) if seeded else None)
           if impl.kind == "ours" else exp_range_note(inputs, config, ct, impl.name, run.outputs, ref.outputs))
    if why:
        res.notes.append(why)
    if repeat > 1:
        res.repeat = repeat_report(runs, info)
    res.exponents = exponent_ranges(exp_taps, info, chunk_list, head_list, base)
    decay = decay_coverage_note(res.exponents)
    if decay:
        res.notes.append(decay)
    # the rerun and the amplification follow the first BUG where there is one: a first divergence within its
    # noise (DRIFT, as bf16 mode's clean runs hold) would send them after rounding instead of the bug
    first = res.focus
    if first is not None:
        res.amplification = amplification(res, first)
        if window > 0:
            if impl.takes_initial_state and first["chunk"] is not None:  # else not run (window_rerun says why)
                step("window rerun")
            seen = "S" in res.cells   # (no S compared: a state update before the cell's chunk starts the window)
            res.origin = window_rerun(inputs, config, states, info, first, impl, device, tols, window, drift_fails,
                                      precision if noise_floor else None, storage_tols, state_seen=seen)
            if res.origin is not None:   # which cell the rerun was of (the first BUG, where there is one)
                res.origin["of"] = {k: first[k] for k in ("tap", "chunk", "head", "label")}
                carried_seed(res, res.origin)
            div = res.first_divergence
            if (div["tap"], div["chunk"], div["head"]) != (first["tap"], first["chunk"], first["head"]):
                # a DRIFT first divergence before the BUG: rerun it too, it may be where the bug starts (a
                # planted bug's own rows can sit under ten times their floor while what they feed is a BUG)
                if impl.takes_initial_state and div["chunk"] is not None:
                    step("window rerun of the first divergence")
                res.origin_first = window_rerun(inputs, config, states, info, div, impl, device, tols, window,
                                                drift_fails, precision if noise_floor else None, storage_tols,
                                                state_seen=seen)
                if res.origin_first is not None:
                    carried_seed(res, res.origin_first)
                    res.origin_first["of"] = {k: div[k] for k in ("tap", "chunk", "head", "label")}
        else:   # null would read as "nothing diverged"
            res.origin = {"verdict": None, "reason": "not run (--window 0)"}
    step(None)
    return res


def unchecked_note(name: str, u: dict, outputs: dict, impl: str) -> str:
    """The note of a ``dA_log``/``ddt_bias`` whose sum cannot be checked (``compare.carried.unchecked_in``): its
    error split in figures, and which part is the larger (its label is the noise floor's)."""
    more = f" (the worst of {u['cells']} such cells)" if u["cells"] > 1 else ""
    return (f"{name}: its sum cannot be checked at head {u['head']}{more}: dg came back in "
            f"{low_dtype(outputs)} from {impl}, whose rounding alone can move {name} up to ratio {u['reach']:.3g} "
            f"from the exact sum of the returned dg. Of its error, that exact sum is {u['carried']:.3g} from the "
            f"reference (dg's part, which dg's rows judge) and its {name} {u['own']:.3g} from that sum (the sum's own "
            f"part, or dg's rounding: within {u['reach']:.3g} they cannot be told apart); "
            f"{unchecked_hint(u['carried'], u['own'])}")


def tensor_verdicts(mine: dict, theirs: dict, row_ids: dict, info: ChunkInfo, tols: dict, tols16: dict | None,
                    dtypes: dict, carried: dict, floor: dict | None = None, precision: str = "fp32",
                    tol_sums: dict | None = None, unchecked: dict | None = None) -> dict:
    """Each output and gradient over the compared rows as one tensor, judged by ``run``'s rule
    (``run.judged``: fla's ratio over its valid elements; one returned in 16 bits at fp32's tolerance whose
    rounding alone is over it, at bf16 mode's: ``tol`` is then that one, ``storage`` the dtype): ``{name:
    {"ratio", "max_abs", "tol", "storage", "elements", "pass", "unrep", "carried_in_from_dg", "failed"}}``,
    ``pass`` as in ``run``'s JSON (within tolerance; None: nothing compared), ``failed`` whether it fails the
    verdict (over tolerance, neither UNREP nor carried in). A diff whose cells are all within their noise floor (DRIFT) can still
    hold a tensor that ``run`` fails: ``DiffResult.verdict`` then fails too, so that the two commands agree. A
    ``dA_log``/``ddt_bias`` whose error is carried in from ``dg`` (``carried``: the implementation's value is
    within tolerance of the exact sum of its own ``dg`` at every head, ``compare.carried``; ``carried``: name ->
    that exact sum's rows) does not fail here: ``dg``'s rows are judged on their own. Its
    ``carried_in_from_dg`` is then ``{"ratio", "own"}`` as in ``run``'s JSON (the exact sum against the
    reference, the implementation's value against the exact sum, over the compared rows), else None. ``floor``:
    the noise floor's rows (one tensor or a tuple of samples per name): a failing tensor within ten times the
    floor's own ratio where that is over the tolerance is UNREP, as ``run`` judges it (``Compare.judge_precision``;
    ``precision_floor`` the larger sample's ratio). ``tol_sums`` (``diff A B``, A not the float64 reference:
    :func:`tolerance_sums`): a tensor over its tolerance within the sum of both files' does not fail either;
    its ``tol_sum`` is then that sum (else None). ``unchecked``: ``dA_log``/``ddt_bias`` whose sum cannot be
    checked at some head (``compare.carried.unchecked_in``) and is a BUG at none, name -> (the exact sum's rows,
    the marked cells, the dtype dg came back in): over its tolerance and not carried in, such a tensor is judged
    by the floor's rule at either precision (UNREP within ten times a floor itself over the tolerance), its
    ``sum_not_checkable`` the split over the tensor with the cells' (``{"dtype", "carried", "own", "heads"}``)."""
    from .compare.quantities import valid_mask

    out = {}
    for n, x in mine.items():
        lengths = torch.tensor([info.length[c] if c is not None else 0 for c in row_ids[n]], dtype=torch.long)
        mask = valid_mask(n, lengths, tuple(x.shape[2:])) if x.ndim > 2 else None
        # tols16 None (not fp32): the storage rule has no other tolerance to apply
        row = judged_tensor(n, x, theirs[n], mask, tols[n], (tols16 or tols)[n], dtypes.get(n))
        if n in carried and row.passed is False:
            ref = theirs[n].to(torch.float64)
            exact = carried[n].to(ref.device, torch.float64)
            m = None if mask is None else mask.to(ref.device)
            row.carried = compare(n, exact, ref, m).ratio
            row.carried_own = compare(n, x.to(ref.device, torch.float64), exact, m).ratio
        # fp32 only (16 bits: the storage rule; bf16 mode's noise model rounds the products' operands only, and
        # its floor of dg can be ten times what bf16 kernels reach: the whole tensor stays the backstop there)
        # (nor dA_log, ddt_bias: theirs is the carried-in rule, which a wrong sum fails whatever its floor)
        # (a dA_log/ddt_bias whose sum cannot be checked has no carried-in rule to judge it: the floor's, at either
        # precision, as its cells are)
        if row.failed and floor is not None and n in floor and row.storage is None and \
                ((precision == "fp32" and n not in REDUCED) or n in (unchecked or {})):
            samples = floor[n] if isinstance(floor[n], tuple) else (floor[n],)
            ref = theirs[n].to(torch.float64)
            m = None if mask is None else mask.to(ref.device)
            row.judge_precision(max(compare(n, f.to(ref.device, torch.float64), ref, m).ratio for f in samples),
                                precision)
        if n in (unchecked or {}) and row.passed is False and row.carried is None:
            exact, heads, dtype = unchecked[n]
            ref = theirs[n].to(torch.float64)
            exact = exact.to(ref.device, torch.float64)
            m = None if mask is None else mask.to(ref.device)
            row.sum_unchecked = {"dtype": dtype, "carried": compare(n, exact, ref, m).ratio,
                                 "own": compare(n, x.to(ref.device, torch.float64), exact, m).ratio,
                                 "heads": head_fields(heads)}
        failed = row.passed is False and row.unrep is None and row.carried is None
        tol_sum = (tol_sums or {}).get(n)
        within = failed and tol_sum is not None and row.compared and math.isfinite(row.ratio) and row.ratio <= tol_sum
        failed = failed and not within
        # the tolerance the verdict was taken at: bf16 mode's where the storage's rounding alone is over fp32's
        tol = (tols16 or tols)[n] if row.floor is not None and row.floor > row.tol else row.tol
        out[n] = {"ratio": row.ratio if row.compared else None, "max_abs": row.max_abs if row.compared else None,
                  "tol": tol, "storage": row.storage if tol != row.tol else None, "elements": int(row.count),
                  "pass": row.passed, "unrep": row.unrep, "carried_in_from_dg": carried_json(row),
                  "precision_floor": row.precision_floor, "failed": failed, "tol_sum": tol_sum if within else None,
                  "sum_not_checkable": row.sum_unchecked}
    return out


# two taps files, no reference


def computed_at(f: dict) -> tuple[str | None, str]:
    """What taps file ``f``'s values were computed at, and what in its metadata says so: ``"float64"`` for the
    reference (``precision`` float64; recording none, ``source`` reference, or every value it holds float64),
    ``"fp32"``/``"bf16"`` as recorded (``taps``, ``run --save`` and ``capture`` record it), else None."""
    meta = f["metadata"]
    own, source = str(meta.get("precision", "")).strip(), meta.get("source")
    who = f"source {source}" if source else "no source"
    if own in ("float64", "fp32", "bf16"):
        return own, f"{who}, precision {own}"
    if own:
        return None, f"{who}, precision {own!r}"
    if source == "reference":
        return "float64", f"{who}, no precision recorded"
    values = [*f["outputs"].values(), *f["taps"].values()]
    if values and all(t.dtype == torch.float64 for t in values):
        return "float64", f"{who}, no precision recorded, every value float64"
    return None, f"{who}, no precision recorded"


def tolerance_sums(a: dict, b: dict, precision: str, tols: dict, tol_overrides: list[str] | None = None
                   ) -> dict[str, float]:
    """``diff A B``: how far two correct files may differ, per quantity, where that is over its tolerance: the sum
    of both files' tolerances, a file's own 0 where it is the float64 reference (:func:`computed_at`), else its
    tolerance at the precision it records (B's: the compared one; one recording none: the compared one). Empty
    where A is the float64 reference (B is judged against it as against the reference: nothing changes), or
    where B is and A was computed at the compared precision (their difference is A's own error)."""
    at_a, at_b = computed_at(a)[0], computed_at(b)[0]
    if at_a == "float64":
        return {}
    own_a = tols if at_a in (None, precision) else cell_tolerances(at_a, tol_overrides)
    sums = {n: own_a.get(n, t) + (0.0 if at_b == "float64" else t) for n, t in tols.items()}
    return {n: v for n, v in sums.items() if v > tols[n]}


def files_rule_note(a: dict, b: dict, precision: str, sums: dict, res: DiffResult) -> str:
    """Which rule judged ``diff A B``'s cells (A the float64 reference, or both files approximations:
    :func:`tolerance_sums`) and how many cells it covered."""
    n = res.counts()
    (at_a, how_a), (at_b, how_b) = computed_at(a), computed_at(b)
    cells = f"{n['cells']} compared cell{'' if n['cells'] == 1 else 's'}"
    if at_a == "float64":
        return (f"A ({a['path']}) is the float64 reference (its metadata: {how_a}): every cell over its tolerance "
                f"is a BUG ({n['bug']} of the {cells})")
    a_is = (f"A ({a['path']}) is not the float64 reference (its metadata: {how_a}"
            f"{f'; taken as computed at {precision}' if at_a is None else ''})")
    if at_b == "float64":
        if not sums:
            return (f"{a_is}; B ({b['path']}) is ({how_b}): their difference is A's own error, and every cell over "
                    f"its tolerance is a BUG ({n['bug']} of the {cells})")
        rule = (f"; B ({b['path']}) is ({how_b}): their difference is A's own error, up to A's tolerance at {at_a}, "
                f"over the {precision} one B is judged at")
    else:
        both = (f"2 x each cell's tolerance at {precision}" if at_a in (None, precision) else
                f"each cell's tolerance at {precision} plus its tolerance at {at_a}")
        rule = (f", nor is B ({b['path']}: {how_b}): both are approximations, so a correct pair may differ by up "
                f"to the sum of both files' tolerances ({both})")
    within = [f"{k} {t['ratio']:.3g} > tol {t['tol']:g}" for k, t in res.tensors.items() if t.get("tol_sum")]
    tensors = f"; within it as whole tensors, not failed: {', '.join(within)}" if within else ""
    return (f"{a_is}{rule}: of the {cells}, {n['drift']} over their tolerance are within that sum (DRIFT, failing "
            f"only with --strict) and {n['bug']} beyond it (BUG){tensors}")


def diff_taps_files(a: dict, b: dict, *, precision: str = "fp32", names: tuple[str, ...] = TAP_NAMES,
                    chunks: tuple[int, int] | None = None, heads: tuple[int, ...] | None = None,
                    spec: TapsSpec = TapsSpec(), tol_overrides: list[str] | None = None,
                    drift_fails: bool = False) -> DiffResult:
    """Compare the taps of file ``b`` (converted by ``spec``) to those of file ``a``, which plays the
    reference, and the outputs and gradients both files hold, cut into per-chunk rows as ``diff DUMP``
    cuts them (the dump's chunk table is rebuilt from the outputs' shapes and the files' chunk tables:
    :func:`files_chunk_table`). No dump: no noise floor (failing cells are BUG), no window rerun.
    Example: ``diff_taps_files(read_taps_file("ours.safetensors"), read_taps_file("theirs.safetensors"))``.
    """
    from kdadbg_kernels.taps import REGISTRY

    tols = cell_tolerances(precision, tol_overrides)
    for f in (a, b):
        if not f["chunks"] or not len(f["chunks"]["index"]):   # (an empty chunk table: outputs only)
            raise KdadbgError(f"{f['path']}: holds no taps (no chunk table) to compare; diff DUMP --against "
                              f"{f['path']} compares its outputs and gradients")
    try:
        C = int(a["metadata"].get("chunk_size") or b["metadata"].get("chunk_size") or 0)
    except ValueError:
        C = 0
    if C <= 0:
        C = max((t.shape[2] for n, t in a["taps"].items() if REGISTRY[n].shape[:1] == ("C",)), default=16)
    info = ChunkInfo.from_file(a, C)
    a_ids, b_ids = [int(i) for i in a["chunks"]["index"]], [int(i) for i in b["chunks"]["index"]]
    for i, c in enumerate(b_ids):
        if c in info.length and int(b["chunks"]["len"][i]) != info.length[c]:
            raise KdadbgError(f"{b['path']}: chunk {c} has len {int(b['chunks']['len'][i])}, but "
                              f"{info.length[c]} in {a['path']}")
    lo, hi = (min(a_ids), max(a_ids) + 1) if chunks is None else chunks
    want_chunks = [c for c in sorted(a_ids) if lo <= c < hi]
    a_heads, b_heads = [int(h) for h in a["heads"]], [int(h) for h in b["heads"]]
    want_heads = a_heads if heads is None else list(heads)
    rows = [c for c in want_chunks if c in b_ids]
    hs = [h for h in want_heads if h in a_heads and h in b_heads]
    missing = {"taps": [n for n in names if n in a["taps"] and n not in b["taps"]],
               "chunks": [c for c in want_chunks if c not in b_ids],
               "heads": [h for h in want_heads if h not in hs],
               "not_written": [],
               # those B holds (or --taps asked for by name): not every tap neither file holds
               "not_in_reference_file": [n for n in names if n not in a["taps"]
                                         and (n in b["taps"] or tuple(names) != TAP_NAMES)]}
    pick_a = {n: a["taps"][n] for n in names if n in a["taps"] and n in b["taps"]}
    cand = convert_taps({n: b["taps"][n] for n in pick_a}, spec)
    # all NaN in B where A is not: compared (its cells fail as non-finite) and named, as diff DUMP --against names it
    missing["not_written"] = [n for n in cand if all_nan(cand[n]) and not all_nan(pick_a[n])]

    # outputs and gradients: those both files hold, per chunk row (as diff DUMP --against B compares them)
    not_provided = {n: f"not in {b['path']}" for n in OUTPUT_NAMES if n in a["outputs"] and n not in b["outputs"]}
    not_provided.update({n: f"not in {a['path']} (the reference file)" for n in OUTPUT_NAMES
                         if n in b["outputs"] and n not in a["outputs"]})
    shared = [n for n in OUTPUT_NAMES if n in a["outputs"] and n in b["outputs"]]
    if not a["outputs"] and not b["outputs"]:   # taps alone: not a full pass, as diff DUMP --against such a file
        not_provided.update({n: "in neither file: written without outputs (taps --no-outputs)"
                             for n in ("o", "dq", "dk", "dv", "dg", "dbeta")})
    for n in shared:
        if tuple(a["outputs"][n].shape) != tuple(b["outputs"][n].shape):
            raise KdadbgError(f"{b['path']}: output '{n}' has shape {list(b['outputs'][n].shape)}, but "
                              f"{list(a['outputs'][n].shape)} in {a['path']}")
    mine = theirs = {}
    row_ids: dict[str, list] = {}
    notes = []
    whole = None   # the outputs over every chunk and head (the selection's, if asked): the tensors' verdicts
    if shared and rows and hs:
        ct, why = files_chunk_table(a, b, C, shared)
        if ct is None:
            not_provided.update({n: f"held by both files, but not placed in chunks: {why}" for n in shared})
            notes.append(f"outputs and gradients not compared ({why}): diff DUMP --against {b['path']} compares "
                         f"them")
        else:
            info = ChunkInfo.from_table(ct)
            shapes = {n: a["outputs"][n].shape for n in shared}
            G = shapes["o"][2] // shapes["dq"][2] if "o" in shapes and "dq" in shapes and shapes["dq"][2] else 1
            mine, row_ids = output_rows({n: b["outputs"][n] for n in shared}, ct, _layout(b), rows, hs, G)
            theirs, _ = output_rows({n: a["outputs"][n] for n in shared}, ct, _layout(a), rows, hs, G)
            # both files hold the outputs whole, whatever chunks and heads their taps cover: the whole-tensor
            # verdicts take every chunk and head (those of --chunks/--heads only where asked), as diff DUMP's do
            HV = next((shapes[n][2] for n in ("o", "dv", "dg", "dbeta") if n in shapes), max(hs) + 1)
            all_rows = [c for c in range(ct.n_chunks) if chunks is None or chunks[0] <= c < chunks[1]]
            all_hs = [h for h in range(HV) if heads is None or h in heads]
            if all_rows == rows and all_hs == hs:
                whole = (mine, theirs, row_ids)
            else:
                m_all, ids_all = output_rows({n: b["outputs"][n] for n in shared}, ct, _layout(b), all_rows, all_hs, G)
                t_all, _ = output_rows({n: a["outputs"][n] for n in shared}, ct, _layout(a), all_rows, all_hs, G)
                whole = (m_all, t_all, ids_all)
    if (not pick_a and not mine) or not rows or not hs:
        raise KdadbgError(f"nothing to compare: {b['path']} and {a['path']} share no tap × chunk × head for the "
                          f"selection (taps in both: {', '.join(pick_a) or 'none'}; outputs in both: "
                          f"{', '.join(shared) or 'none'})")

    def sel(ids, hl, taps):
        return select({n: t.to(torch.float64) for n, t in taps.items()}, [ids.index(c) for c in rows],
                      [hl.index(h) for h in hs])

    # cells float32 cannot hold (exp(-gc) overflows): judged from A's gc where A holds it, as diff DUMP judges them
    unrep = {}
    if pick_a and "gc" in a["taps"]:
        gc = sel(a_ids, a_heads, {"gc": a["taps"]["gc"]})["gc"]   # [rows, hs, C, K], in rows' order
        first = min(rows)
        full = torch.zeros((max(rows) - first + 1, *gc.shape[1:]), dtype=gc.dtype)
        full[torch.tensor([c - first for c in rows])] = gc
        unrep = unrepresentable({"gc": full}, list(pick_a), {n: rows for n in pick_a}, list(range(len(hs))), info,
                                first)
    # the exp(-gc) taps weighted by exp(gc) where A holds gc (metrics.exp_gc_weight), else compared unweighted
    a_gc = sel(a_ids, a_heads, {"gc": a["taps"]["gc"]})["gc"] \
        if "gc" in a["taps"] and any(n in noise.EXP_NEG_GC_TAPS for n in pick_a) else None
    cells = compare_cells(sel(b_ids, b_heads, cand), sel(a_ids, a_heads, pick_a), {n: rows for n in pick_a}, hs,
                          info, tols, unrep=unrep, gc=a_gc) if pick_a else {}
    missing["not_written"] = written_nowhere(missing["not_written"], cells)
    if mine:
        cells.update(compare_cells(mine, theirs, row_ids, hs, info, tols, group=G))
    # A not the float64 reference: both files are approximations, and two correct ones may differ by the sum of
    # their tolerances (fla_layer, bf16: the float32 reference with bf16 dots against our bf16 kernels, o at 5.1e-3
    # against 5e-3, 7 BUG cells here while diff DUMP --against passed both files)
    sums = tolerance_sums(a, b, precision, tols, tol_overrides)
    for n, c in cells.items():
        if n in sums:
            within_tolerance_sum(c, sums[n], f"A is not the float64 reference, so both files are approximations and "
                                             f"their difference may reach the sum of both tolerances, {sums[n]:.3g} "
                                             f"(tol {c.tol:g})")
    # dA_log, ddt_bias over their tolerance: sums of dg over a head's tokens, whose error the carried-in rule splits
    # into dg's and the sum's own, with the dump's inputs; without them, not judged (a correct bf16 kernel's dA_log
    # at 0.022 against 1e-2 was a BUG here while diff DUMP --against passed it: a user trial)
    for n in REDUCED:   # (beyond the sum of both files' tolerances where that applies)
        if n in cells and bool((cells[n].label == noise.BUG).any()):
            worst = float(torch.nan_to_num(cells[n].ratio, nan=0.0).max())
            not_provided[n] = (f"not compared: over its tolerance ({n} ratio {worst:.3g} > {cells[n].tol:g}), and "
                               f"without the dump a sum of dg over the head's tokens, into which dg's error carries, "
                               f"cannot be judged; diff DUMP --against {b['path']} judges it")
            del cells[n]
            if whole:
                whole = tuple({k: v for k, v in d.items() if k != n} for d in whole)
    cells = {n: cells[n] for n in ORDER if n in cells}
    res = DiffResult("files", (b["path"], a["path"]), precision, None, None, None, info, rows, hs, cells,
                     impl={"name": b["path"], "kind": "taps file"}, drift_fails=drift_fails, missing=missing,
                     taps_asked=tuple(names) != TAP_NAMES,
                     not_provided=not_provided,
                     files={"reference": a["path"], "theirs": b["path"], "state_layout": spec.state_layout,
                            "gate_units": spec.gate_units, "computed_at": {"a": computed_at(a)[0],
                                                                           "b": computed_at(b)[0]},
                            "tol_sum": bool(sums)})
    dump = a["metadata"].get("dump") or b["metadata"].get("dump") or "DUMP"
    res.notes.append(f"no dump: no noise floor, no window rerun; kdadbg diff {dump} --against {b['path']} judges B "
                     f"against the float64 reference with both (and, in bf16, dA_log and ddt_bias by the error dg "
                     f"carries into them)")
    res.notes += notes
    # what only B holds, in the selection: not compared (A, the reference file, defines the cells), and said so
    from .render import id_ranges

    extra_chunks = [c for c in sorted(set(b_ids) - set(a_ids)) if chunks is None or chunks[0] <= c < chunks[1]]
    extra_heads = [h for h in b_heads if h not in a_heads and (heads is None or h in heads)]
    if extra_chunks or extra_heads:
        held = " and ".join(x for x in (
            f"chunk{'s' if len(extra_chunks) > 1 else ''} {id_ranges(extra_chunks)}" if extra_chunks else "",
            f"head{'s' if len(extra_heads) > 1 else ''} {', '.join(map(str, extra_heads))}" if extra_heads else "")
            if x)
        res.notes.append(f"{b['path']} also holds {held}, which {a['path']} (A, the reference file) does not: not "
                         f"compared (diff DUMP --against {b['path']} compares them with the float64 reference)")
    from .impls.tapsfile import written_precision_note

    res.notes += [n for n in (written_precision_note(f["path"], f["metadata"], precision) for f in (a, b)) if n]
    if whole:  # as diff DUMP judges them: B's outputs and gradients as whole tensors against A's
        res.tensors = tensor_verdicts(*whole, info, tols, None,
                                      {n: b["outputs"][n].dtype for n in whole[0]}, {}, tol_sums=sums)
    res.notes.insert(1, files_rule_note(a, b, precision, sums, res))
    first = res.focus
    if first is not None:
        res.amplification = amplification(res, first)
        res.origin = {"verdict": None, "reason": "not available (two taps files: no dump to rerun a window of)"}
    return res


def _layout(f: dict) -> str:
    """A taps file's state layout of ``ht``/``dh0`` (the dump's, in its metadata; ``vk`` by default)."""
    layout = str(f["metadata"].get("state_layout") or "vk").lower()
    if layout not in ("vk", "kv"):
        raise KdadbgError(f"{f['path']}: metadata state_layout: expected vk or kv, found {layout!r}")
    return layout


def files_chunk_table(a: dict, b: dict, C: int, shared: list[str]):
    """The chunk table of the dump two taps files came from, rebuilt without it: ``B, T`` from the outputs'
    shapes; sequences are the batch rows, or (``B`` = 1 and more than one sequence in the files) the
    ``cu_seqlens`` segments, each ending where the files' last chunk of it ends. Every chunk row of both
    files must then agree with the table (sequence, first token, length). Returns ``(table, None)`` or
    ``(None, why)`` where the files do not determine it (a varlen file holding only some chunks)."""
    tok = next((a["outputs"][n] for n in ("o", "dv", "dg", "dbeta", "dq", "dk") if n in shared), None)
    if tok is None:   # ht, dh0, dA_log, ddt_bias only: no token axis
        return None, "no output with a token axis (o, dq, ...) gives the dump's length"
    B, T = int(tok.shape[0]), int(tok.shape[1])
    rows = [(int(i), int(s), int(st), int(n)) for f in (a, b) for i, s, st, n in
            zip(f["chunks"]["index"], f["chunks"]["seq"], f["chunks"]["start"], f["chunks"]["len"])]
    n_seqs = max((s for _, s, _, _ in rows), default=0) + 1
    for n in ("ht", "dh0"):
        if n in shared:
            n_seqs = max(n_seqs, int(a["outputs"][n].shape[0]))
    cu = None
    if B == 1 and n_seqs > 1:
        ends = {}
        for _, s, st, n in rows:
            ends[s] = max(ends.get(s, 0), st + n)
        if sorted(ends) != list(range(n_seqs)):
            return None, (f"the files hold no chunk of sequence(s) "
                          f"{', '.join(str(s) for s in range(n_seqs) if s not in ends)} of the packed (varlen) dump")
        cu = torch.tensor([0, *(ends[s] for s in range(n_seqs))], dtype=torch.long)
        if int(cu[-1]) != T or bool((cu[1:] < cu[:-1]).any()):
            return None, "the files' chunks do not cover the packed (varlen) sequences to their end"
    elif B > 1 and n_seqs > B:
        return None, f"the files name sequence {n_seqs - 1}, but the outputs have {B} batch rows"
    ct = chunk_table(B, T, cu, C)
    for i, s, st, n in rows:
        if not (0 <= i < ct.n_chunks and int(ct.seq[i]) == s and int(ct.export_start[i]) == st
                and int(ct.length[i]) == n):
            return None, (f"chunk {i} (sequence {s}, first token {st}, {n} rows) does not fit the chunk table of "
                          f"outputs of {B}x{T} tokens at chunk size {C}"
                          + (" with the sequences the files' chunks end" if cu is not None else ""))
    return ct, None


def write_plot(res: DiffResult, path) -> dict:
    """``--plot``: the quantity × chunk heatmap (:func:`kdadbg.render.plot.plot_diff`) as a PNG."""
    from .render.plot import diff_plot_data, plot_diff

    data = diff_plot_data(res)
    out = plot_diff(path, data)
    return {"path": str(out), "rows": [r["name"] for r in data["rows"]],
            "chunks": [data["chunks"][0], data["chunks"][-1]]}


def is_taps_file(path) -> bool:
    """Whether ``path`` is a taps file rather than a dump (:func:`kdadbg.tapsfile.taps_file_kind`: metadata
    ``format`` = kdadbg-taps-v1, or a ``run --save`` file), from its header alone."""
    from .fileio import read_header
    from .tapsfile import taps_file_kind

    specs, meta = read_header(path)   # one line for a missing or unreadable file
    return taps_file_kind(meta, specs) is not None


def same_problem(paths, ma: dict, mb: dict) -> None:
    """Two taps files must come from the same inputs and config: both digests (``inputs_sha256``) equal where
    both have one, and the config keys they both record equal; else one line naming both."""
    from .tapsfile import config_differences

    da, db = ma.get("inputs_sha256"), mb.get("inputs_sha256")
    if da is not None and db is not None and da != db:
        raise KdadbgError(f"{paths[0]}, {paths[1]}: made from different inputs (inputs_sha256 {da[:12]}… of dump "
                          f"{ma.get('dump')!r}, {db[:12]}… of dump {mb.get('dump')!r}): compare two files of one dump")
    diffs = config_differences(ma, mb)
    if diffs:
        raise KdadbgError(f"{paths[0]}, {paths[1]}: made with different configs (A / B: {'; '.join(diffs)}): compare "
                          f"two files of one dump and config")


def diff_paths(paths: list, *, impl: str | None = None, against=None, overrides: dict | None = None,
               device: str = "auto", precision: str = "fp32", names: tuple[str, ...] = TAP_NAMES,
               chunks: tuple[int | None, int | None] | None = None, heads: tuple[int, ...] | None = None,
               spec: TapsSpec = TapsSpec(), tol_overrides: list[str] | None = None, window: int = 3,
               repeat: int = 1, drift_fails: bool = False, noise_floor: bool = True, allow_nonfinite: bool = False,
               full_run: bool = False, max_interpreter_s: float | None = None,
               progress: Progress | None = None) -> DiffResult:
    """What ``kdadbg diff`` computes: ``[DUMP]`` with ``impl`` (a name, ``PATH.py:FN``, ...) or ``against``
    a taps file, or ``[A, B]`` (two taps files).

    Example: ``diff_paths(["sample_inputs/basic.safetensors"], precision="bf16").first_divergence``.
    """
    from .dump import load_dump
    from .export import resolve_device
    from .selection import resolve_selection
    from .tapsfile import read_taps_file

    if repeat < 1:
        raise KdadbgError(f"--repeat: expected at least 1, found {repeat}")
    seeded = chunks is not None and not full_run
    if window < 0:
        raise KdadbgError(f"--window: expected 0 (off) or more chunks, found {window}")
    if len(paths) == 2:
        if against is not None or impl is not None:
            raise KdadbgError("--against/--impl: not with two taps files (A B already names both sides)")
        for p in paths:
            if not is_taps_file(p):
                raise KdadbgError(f"{p}: not a taps file (kdadbg taps writes them); diff A B compares two taps files")
        from .progress import beating

        # (a heartbeat per stage: two large files said nothing for their whole read and comparison)
        from .fileio import read_header

        same_problem(paths, read_header(paths[0])[1], read_header(paths[1])[1])
        lo_hi = None
        if chunks is not None:
            lo_hi = (chunks[0] or 0, chunks[1] if chunks[1] is not None else 1 << 62)
        # a heartbeat after 2 s (large files said nothing for their whole read and comparison: user trial, round
        # 46); a refusal of the files, which comes early, stays the one line on stderr
        with beating(progress, f"reading and comparing {paths[0]} and {paths[1]}", quiet_s=2.0):
            a, b = read_taps_file(paths[0]), read_taps_file(paths[1], spec.state_layout)
            return diff_taps_files(a, b, precision=precision, names=names, chunks=lo_hi, heads=heads, spec=spec,
                                   tol_overrides=tol_overrides, drift_fails=drift_fails)
    if len(paths) != 1:
        raise KdadbgError(f"expected DUMP or two taps files A B, found {len(paths)} paths")
    path = paths[0]
    if is_taps_file(path):
        raise KdadbgError(f"{path}: is a taps file; diff needs the DUMP it came from (with --against TAPS), "
                          f"or a second taps file")
    if against is not None and impl is not None:
        raise KdadbgError("--against FILE is the implementation 'a taps file': not with --impl")
    if against is not None:
        from .impls.tapsfile import TapsFile
        implementation = TapsFile(against, spec, precision)
    else:
        implementation = resolve_impl(impl, precision, spec)
    file_note = None
    if implementation.kind == "taps file":
        # a file holds one run and cannot be rerun on seeded windows: a --chunks window is its rows of the whole
        # run (the seeded path handed it the window's sub-dump, whose digest is not the file's: refused)
        seeded = False
        made = implementation.read()["metadata"].get("chunks")
        if chunks is None and made:   # run --chunks A:B --save: only that window holds values (NaN elsewhere)
            a_, _, b_ = str(made).partition(":")
            try:
                chunks = (int(a_), int(b_))
                file_note = (f"{implementation.path}: holds the outputs of chunks {made} only (made with --chunks "
                             f"{made}); comparing those chunks")
            except ValueError:
                pass
    inputs, config = load_dump(path, overrides, allow_nonfinite=allow_nonfinite)
    B, T = inputs.shape[:2]
    table = chunk_table(B, T, inputs.cu_seqlens, implementation.config_for(config)[0].chunk_size)
    sel = resolve_selection(names, chunks, heads, table.n_chunks, inputs.HV, gva=inputs.group > 1)
    if implementation.kind == "taps file":
        f = implementation.read()
        if not f["outputs"] and not f["taps"]:
            held = ", ".join(f["unknown"]) or "nothing"
            raise KdadbgError(f"nothing to compare: {against}: provides none of o, ht, dq, dk, dv, dg, dbeta, dh0, "
                              f"dA_log, ddt_bias nor any tap.* (it holds: {held})")
        if repeat > 1:
            raise KdadbgError("--repeat: reruns the implementation; a taps file cannot be rerun")
    dev = resolve_device(device)
    res = diff_dump(inputs, config, implementation, dump=str(path), device=dev, names=sel.names,
                    chunks=sel.chunks, heads=sel.heads, tol_overrides=tol_overrides, noise_floor=noise_floor,
                    window=window, repeat=repeat, drift_fails=drift_fails, seeded=seeded,
                    max_interpreter_s=max_interpreter_s, progress=progress)
    from .dump import extra_tensors_note

    unread = implementation.read()["unknown"] if implementation.kind == "taps file" else []
    unread_note = (f"{implementation.path}: holds {len(unread)} entr{'y' if len(unread) == 1 else 'ies'} outside "
                   f"the taps file layout, not read: {', '.join(unread[:12])}{', ...' if len(unread) > 12 else ''}"
                   if unread else None)
    for note in (file_note, unread_note, extra_tensors_note(path)):
        if note:
            res.notes.append(note)
    return res
