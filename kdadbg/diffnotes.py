"""The notes ``diff`` adds to a result, each from what the diff measured: taps that are the reference's in
another convention (``convention_notes``), a dump whose gates flush the state carried between chunks
(``decay_coverage_note``), what could have carried an inherited error in (``carried_seed``), taps never written
(``written_nowhere``), and outputs returned in 16 bits judged at fp32 (``precision_hint``)."""

from __future__ import annotations

import torch

from . import noise
from .compare import DiffResult


def _pure_scale(x: torch.Tensor, r: torch.Tensor) -> float | None:
    """The factor ``s`` with ``x ≈ s·r`` over the elements finite and nonzero on both sides, where that holds
    to 1e-3 (RMS of ``x − s·r`` against RMS of ``x``); None otherwise."""
    x, r = x.detach().to(torch.float64).cpu(), r.detach().to(torch.float64).cpu()
    m = torch.isfinite(x) & torch.isfinite(r) & (r != 0) & (x != 0)
    if int(m.sum()) < 2:
        return None
    x, r = x[m], r[m]
    s = float((x * r).sum() / (r * r).sum())
    return s if float((x - s * r).norm()) <= 1e-3 * float(x.norm()) else None


def transposed_ratio(x: torch.Tensor, r: torch.Tensor) -> float:
    """RMS(r - x^T) / RMS(r) over the elements finite on both sides, ``x^T`` swapping the last two axes (a
    state in the other layout); inf where none is finite."""
    import math

    xt, r = x.detach().to(torch.float64).cpu().transpose(-1, -2), r.detach().to(torch.float64).cpu()
    m = torch.isfinite(xt) & torch.isfinite(r)
    return float((xt - r)[m].norm() / (r[m].norm() + 1e-300)) if bool(m.any()) else math.inf


LOG2_SPEC = "TapsSpec(gate_units='log2')"


def negated_note(cells: dict, *sides: tuple[dict, dict]) -> str | None:
    """A note naming the failing quantities that are the reference's times exactly -1 (``_pure_scale``): a sign
    flipped, which a ratio of 2 in every cell does not say by itself (a user trial: a negated dg). ``sides``:
    ``(candidate, reference)`` dicts of the cells' tensors (taps, output rows)."""
    names = []
    for n, c in cells.items():
        if not bool(c.failing.any()):
            continue
        for cand, ref in sides:
            if n in cand and n in ref:
                s = _pure_scale(cand[n], ref[n])
                if s is not None and abs(s + 1) < 1e-3:
                    names.append(n)
                break
    if not names:
        return None
    return (f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} the reference's times exactly -1 over every "
            f"element compared: a sign flipped where {'it is' if len(names) == 1 else 'they are'} computed (or "
            f"accumulated), not an error of size")


def convention_notes(cells: dict, cand: dict, ref: dict, impl) -> list[str]:
    """Notes where failing taps are the reference's in another convention, which a taps declaration or the
    function's conventions would explain (``TapsSpec``, ``--taps-gate-units``, ``--taps-state-layout``,
    ``state_v_first``): gate taps a pure factor 1/ln 2 or ln 2 off (their gradients the inverse), states that
    match transposed. Said, never converted: a guess would hide a bug that happens to look like a convention."""
    import math

    ln2 = math.log(2)
    failing = {n for n, c in cells.items() if bool(c.failing.any())}
    log2_read_as_ln, ln_read_as_log2 = [], []
    for n in ("gc", "gT", "dgc", "dgT"):
        if n not in failing or n not in cand:
            continue
        s = _pure_scale(cand[n], ref[n])
        if s is None:
            continue
        up, down = (ln2, 1 / ln2) if n.startswith("d") else (1 / ln2, ln2)
        if abs(s - up) < 1e-3 * up:
            log2_read_as_ln.append(n)
        elif abs(s - down) < 1e-3 * down:
            ln_read_as_log2.append(n)
    notes = []
    # a taps file's conventions are the flags'; a function's, the TapsSpec it returns (the flags describe a taps
    # file and are refused without one: a user trial)
    as_file = getattr(impl, "kind", None) == "taps file"

    def declare(flag: str, spec: str) -> str:
        return flag if as_file else f"{spec} returned from --impl {impl.name} (the {flag.split()[0]} flag is a taps file's)"

    if log2_read_as_ln:
        notes.append(f"{', '.join(log2_read_as_ln)} {'is' if len(log2_read_as_ln) == 1 else 'are'} the reference's "
                     f"times exactly 1/ln 2 (a gate) or ln 2 (its gradient): taps in log2 units read as natural-log; "
                     f"declare their units ({declare('--taps-gate-units log2', LOG2_SPEC)})")
    if ln_read_as_log2:
        notes.append(f"{', '.join(ln_read_as_log2)} {'is' if len(ln_read_as_log2) == 1 else 'are'} the reference's "
                     f"times exactly ln 2 (a gate) or 1/ln 2 (its gradient): natural-log taps declared as log2, or "
                     f"an implementation that takes the dump's natural-log gate as log2 (2^g where e^g is meant: a "
                     f"missing ln 2)")
    # exp2 of the natural-log gate inside the implementation (2^g where e^g is meant): its gate taps right, the taps
    # that exponentiate it the reference's times exp((ln 2 - 1) x) of their exponent x (a user trial)
    if "gc" in ref and "gT" in ref:
        gc, gT = ref["gc"].to(torch.float64), ref["gT"].to(torch.float64)[:, :, None, :]
        args = {"qd": gc, "kd": gc, "ki": -gc, "kr": gT - gc}
        exp2 = [n for n, x in args.items() if n in failing and n in cand and n in ref and
                _pure_scale(cand[n], ref[n].to(torch.float64) * torch.exp((ln2 - 1) * x)) is not None and
                abs(_pure_scale(cand[n], ref[n].to(torch.float64) * torch.exp((ln2 - 1) * x)) - 1) < 1e-3]
        if exp2:
            notes.append(f"{', '.join(exp2)} {'is' if len(exp2) == 1 else 'are'} the reference's with 2^x where e^x "
                         f"is meant (x its exponent, from gc): an exp2 of the natural-log gate, a missing ln 2 in "
                         f"the exponent where {'it is' if len(exp2) == 1 else 'they are'} formed")
    flipped = []
    for n in ("S", "dS"):
        if n not in failing or n not in cand or cand[n].shape[-1] != cand[n].shape[-2]:
            continue
        err = transposed_ratio(cand[n], ref[n])
        if err <= cells[n].tol:
            flipped.append(f"{n} (ratio {err:.3g})")
    if flipped:
        notes.append(f"{', '.join(flipped)} match{'es' if len(flipped) == 1 else ''} the reference transposed, "
                     f"within tolerance: [V,K] states read as [K,V] or the other way; declare the taps' layout "
                     f"({declare('--taps-state-layout vk (or kv)', 'TapsSpec(state_layout=...)')})"
                     + ("" if as_file else "; a function with a state_v_first parameter is handed states as the "
                                           "dump lays them out, one without it [K,V]"))
    return notes


def decay_coverage_note(exponents: list[dict]) -> str | None:
    """Where most compared chunks decay every channel of every head past float32's range in one chunk
    (``exp(gT)`` below float32's smallest normal, 1.2e-38): the state leaving such a chunk keeps nothing
    measurable of the state entering it, so a fault in the decay carried between chunks cannot show on this
    dump, whatever it passes. None where fewer than half the chunks do."""
    from .noise import EXP_LIMIT_FP32
    from .render import id_ranges

    flushed = [e["chunk"] for e in exponents if e["gT"][1] < -EXP_LIMIT_FP32]
    if not exponents or 2 * len(flushed) < len(exponents):
        return None
    return (f"in {len(flushed)} of {len(exponents)} chunks ({id_ranges(flushed)}) the gate decays every channel "
            f"of every head past float32's range within the chunk (gT < -{EXP_LIMIT_FP32:.1f}: exp(gT) < 1.2e-38): "
            f"the state leaving them keeps nothing measurable of the state entering them, so this dump cannot show "
            f"a fault in the decay carried between chunks; a dump with milder gates (the kimi or fla_layer "
            f"presets) tests it")


def carried_seed(res: DiffResult, origin: dict) -> None:
    """For an ``inherited`` rerun: what could have carried the error in, as this diff measured it (``origin``
    gets ``carried_by``): None for a forward-prepare tap, which reads only its chunk's own tokens (nothing is
    carried into it); else the worst cell of the states seeding the window in this run (``S`` entering its
    first chunk; for a backward tap also ``dS`` arriving after its last) over the rerun's value heads, with its
    label and ratio, where the diff compared them. Within tolerance there, the states carried no error in
    over tolerance."""
    if origin.get("verdict") != "inherited" or "window" not in origin:
        return
    from .compare.quantities import QUANTITIES
    from .compare.result import label_of

    stage = QUANTITIES[origin["tap"]].stage
    if stage == "fwd_prepare":
        origin["carried_by"] = None
        return
    lo, hi = origin["window"]
    seeds = [("S", lo)] + ([] if stage.startswith("fwd") else [("dS", hi + 1)])
    heads = origin.get("value_heads") or [origin["head"]]   # dq/dk under GVA: the q/k head's value heads
    rank = {"OK": 0, "UNREP": 0, "DRIFT": 1, "BUG": 2}
    worst = None
    for name, chunk in seeds:
        cells = res.cells.get(name)
        if cells is None or chunk not in cells.chunks or res.info.seq.get(chunk) != origin["seq"]:
            continue
        r = cells.chunks.index(chunk)
        for h in heads:
            j = cells.column(h)
            if j is None or int(cells.count[r, j]) == 0:
                continue
            cell = {"tap": name, "chunk": chunk, "head": h, "label": label_of(cells, r, j),
                    "ratio": float(cells.ratio[r, j]), "tol": cells.tol}
            if worst is None or (rank.get(cell["label"], 0), cell["ratio"] / cell["tol"]) > \
                    (rank.get(worst["label"], 0), worst["ratio"] / worst["tol"]):
                worst = cell
    if worst is not None:
        origin["carried_by"] = worst


def written_nowhere(names: list[str], cells: dict) -> list[str]:
    """Of the taps all NaN on the implementation's side, those whose reference is finite somewhere in the
    compared (valid) rows: a cell of theirs compared an element (NaN against a finite value). A reference
    NaN there too, finite only in its padding rows, says nothing of whether the tap was written."""
    return [n for n in names if n in cells and bool((cells[n].count > 0).any())]


def precision_hint(precision: str, cells: dict, dtypes: dict, name: str) -> str | None:
    """A note where most output/gradient cells are UNREP at fp32 because the implementation returns them
    in 16 bits: a pass that judged few cells, which ``--precision bf16`` (bf16's tolerances) would judge."""
    low = {n: str(dt).removeprefix("torch.") for n, dt in dtypes.items() if dt in (torch.bfloat16, torch.float16)}
    if precision != "fp32" or not low:
        return None
    rows = [c for n, c in cells.items() if not c.quantity.is_tap]
    judged = sum(int((c.count > 0).sum()) for c in rows)
    unrep = sum(int(((c.label == noise.UNREP) & (c.count > 0)).sum()) for c in rows)
    if not judged or 2 * unrep <= judged:
        return None
    kinds = "; ".join(f"{', '.join(n for n in low if low[n] == d)} in {d}" for d in dict.fromkeys(low.values()))
    grads = any(n.startswith("d") for n in low)   # autograd's: a 16-bit leaf's gradient comes back in 16 bits
    return (f"{unrep} of {judged} output/gradient cells are UNREP: {name} returns {kinds}"
            + (" (a gradient comes back in its input's dtype, whatever the function computed in)" if grads else "")
            + ", values that fp32's tolerances cannot judge; --precision bf16 judges them at bf16's")


def transposed_states_note(outputs: dict, ref: dict, failing: set, tols: dict, impl_name: str) -> str | None:
    """A note where a failing ``ht``/``dh0`` (whole tensors ``[N, HV, a, a]``) matches the reference transposed
    within its tolerance: states returned as ``[K,V]`` where the dump lays them out ``[V,K]``, or the other way.
    Said, never converted (a guess would hide a bug). A user trial: a function returning ``ht`` as
    ``[K,V]`` on a ``vk`` dump read "ht 1.409 FAIL" and "BUG, introduced here", with no word of the layout."""
    hits = []
    for n in ("ht", "dh0"):
        if n not in failing or n not in outputs or n not in ref:
            continue
        x = outputs[n]
        if x.ndim < 2 or x.shape[-1] != x.shape[-2] or x.shape != ref[n].shape:
            continue
        err = transposed_ratio(x, ref[n])
        if err <= tols[n]:
            hits.append(f"{n} (ratio {err:.3g})")
    if not hits:
        return None
    return (f"{', '.join(hits)} match{'es' if len(hits) == 1 else ''} the reference transposed, within tolerance: "
            f"{impl_name} returns its states as [K,V] where the dump's are [V,K], or the other way; a function with "
            f"a state_v_first parameter is handed and must return states as the dump lays them out (state_v_first "
            f"True: [V,K]), one without it [K,V]")
