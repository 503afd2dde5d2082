"""Localisation beyond the first divergence: made here or carried in (a window rerun of the
implementation under test, seeded from the reference), amplification along the sequence, the
exponent arguments per chunk (NaN/Inf) and determinism (``--repeat``)."""

from __future__ import annotations

import math

import torch

from kdadbg_kernels.taps import TapSelection

from .chunks import chunk_table
from .compare import ChunkInfo, DiffResult, compare_cells, output_rows
from .compare.quantities import QUANTITIES, TAP_ORDER, dataflow_key
from .config import KDAConfig, KDAInputs
from .errors import KdadbgError
from . import noise
from .impls.base import Implementation, ImplError, ImplRun, as_received
from .noise import EXP_LIMIT_FP32


def select(taps: dict[str, torch.Tensor], rows: list[int], heads: list[int]) -> dict[str, torch.Tensor]:
    """``taps[n][rows][:, heads]`` on each tap's own device."""
    out = {}
    for n, t in taps.items():
        ri = torch.tensor(rows, dtype=torch.long, device=t.device)
        hi = torch.tensor(heads, dtype=torch.long, device=t.device)
        out[n] = t.detach().index_select(0, ri).index_select(1, hi)
    return out


def all_nan(t: torch.Tensor) -> bool:
    return t.numel() > 0 and bool(torch.isnan(t).all())


# made here or carried in


def producer_chunk(name: str, chunk: int, info: ChunkInfo) -> int:
    """The chunk whose computation writes ``name`` of ``chunk``: ``S[c]`` is made by chunk ``c-1``'s state
    update (chunk ``c`` itself when it is its sequence's first: ``S = h0``); everything else by ``c``."""
    if name == "S" and info.t[chunk] > 0:
        return chunk - 1
    return chunk


def window_inputs(inputs: KDAInputs, config: KDAConfig, ref_taps: dict, info: ChunkInfo, first: int, last: int,
                  seed_dtype: torch.dtype = torch.float32, upstream: dict | None = None) -> KDAInputs:
    """One sequence's tokens from chunk ``first`` to the end of chunk ``last`` (same sequence), as a
    single-sequence dump: ``h0`` = the reference's ``S[first]``, ``dht`` = the reference's
    ``dS[last + 1]`` or the dump's ``dht`` when ``last`` ends the sequence (both in the dump's layout,
    per value head, in ``seed_dtype``: float32 for an implementation, float64 for the reference; q and
    k keep their q/k heads, so a GVA dump stays one). ``upstream`` (an implementation's ``ImplRun.upstream``):
    ``dht`` as that implementation's backward received it, rounded from a float32 seed to its 16-bit dtype, for
    the reference's side of a window it ran on."""
    B, T, H, K, V = inputs.shape
    n = info.seq[first]
    t0 = info.start[first] if inputs.cu_seqlens is not None else n * T + info.start[first]
    length = sum(info.length[c] for c in range(first, last + 1))

    def tok(x):
        flat = x.reshape(B * T, *x.shape[2:])
        return flat[t0:t0 + length].unsqueeze(0).contiguous()

    def state(S):  # math [H,K,V] -> dump layout [1,H,*]
        S = S.to("cpu", seed_dtype)
        return (S.transpose(-1, -2) if config.state_layout == "vk" else S).unsqueeze(0).contiguous()

    h0 = state(ref_taps["S"][first])
    seq_end = info.seq_chunks(n)[-1]
    if last == seq_end:
        dht = None if inputs.dht is None else inputs.dht[n:n + 1].clone()
    else:
        dht = state(ref_taps["dS"][last + 1])
    if dht is not None and (upstream or {}).get("dht") is not None:
        dht = dht.to(torch.float32).to(upstream["dht"]).to(dht.dtype)
    return KDAInputs(q=tok(inputs.q), k=tok(inputs.k), v=tok(inputs.v), g=tok(inputs.g), beta=tok(inputs.beta),
                     do=tok(inputs.do), dht=dht, h0=h0, cu_seqlens=None, A_log=inputs.A_log,
                     dt_bias=inputs.dt_bias)


def window_rerun(inputs: KDAInputs, config: KDAConfig, ref_taps: dict, info: ChunkInfo, first: dict,
                 impl: Implementation, device: str, tols: dict[str, float], window: int = 3,
                 drift_fails: bool = False, precision: str | None = None,
                 storage_tols: dict[str, float] | None = None, state_seen: bool = True) -> dict:
    """Rerun the implementation under test on a window starting at the diverging chunk, seeded from
    the reference.

    The window holds ``window`` chunks from the producer of the diverging quantity (``S[c]``: chunk
    ``c-1``) or to the end of its sequence. Where the diff compared no ``S`` (``state_seen`` False: an
    implementation without taps), a quantity that reads the state entering its chunk (all but the forward
    prepare taps) starts the window one chunk earlier, at the state update that wrote that state: seeded at its
    own chunk, a wrong state update before it read as "inherited" (a user trial). If the diverging cell still fails there, its error was
    ``introduced`` by that chunk; if it passes, it was ``inherited`` from earlier chunks (forward) or
    later chunks (backward). With ``precision`` the window's cells are labelled against the noise floor of
    the window at that precision as the diff's own are (a value stored in 16 bits including its rounding;
    ``storage_tols`` as in ``compare_cells``), so that a cell at its floor does not read as "still diverges".
    """
    from .reference import run_reference

    name, chunk, head = first["tap"], first["chunk"], first["head"]
    heads = first.get("value_heads") or [head]   # dq/dk under GVA: head is a q/k head, rerun its group
    if chunk is None:
        return {"verdict": None, "reason": f"{name} sums every chunk of the head: no window to rerun"}
    if not impl.takes_initial_state:
        why = ("a taps file cannot be rerun" if impl.kind == "taps file" else
               f"--impl {impl.name} takes no initial_state/output_final_state")
        return {"verdict": None, "reason": f"not available ({why})"}
    n = info.seq[chunk]
    if name == "S" and info.t[chunk] == 0:
        # S entering a sequence is its initial state: a rerun would seed it, testing nothing
        return {"verdict": "introduced", "tap": name, "chunk": chunk, "seq": n, "head": head,
                "reason": f"introduced at the sequence's start: S at chunk {chunk}, the first of sequence {n}, is "
                          f"its initial state (h0, or 0 without one), which a window's rerun would seed and so "
                          f"cannot test; differing from it, the implementation did not start the sequence from its "
                          f"initial state (a state not reset at the boundary, or loaded from the wrong place)"}
    start = producer_chunk(name, chunk, info)
    reads_state = QUANTITIES[name].stage != "fwd_prepare" if name in QUANTITIES else False
    if not state_seen and start == chunk and info.t[chunk] > 0 and reads_state:
        start = chunk - 1   # the state update that wrote S[c], which no compared S tap shows
    seq_chunks = info.seq_chunks(n)
    last = min(seq_chunks[-1], max(chunk, start + max(1, window) - 1))
    w_in = window_inputs(inputs, config, ref_taps, info, start, last)
    nwc = last - start + 1
    d = {"window": [start, last], "seq": n, "seq_start": info.t[start] == 0, "head": head, **({"value_heads": heads} if "value_heads" in first else {}),
         "seeded": {
        "h0": f"reference S[{start}]",
        "dht": (f"reference dS[{last + 1}]" if last != seq_chunks[-1] else
                "the dump's dht" if inputs.dht is not None else "no dht (the dump has none)")}}
    try:   # the window is a dump of its own (one sequence, B = 1, seeded h0): the implementation may fail on it
        wrun = impl.run(w_in, config, device=device, taps=TapSelection(names=TAP_ORDER, chunks=(0, nwc),
                                                                        heads=tuple(heads)))
    except ImplError as e:
        return {**d, "verdict": None, "reason": f"not available (the implementation raised on the window rerun: "
                                                 f"{_one_line(e)})"}
    except KdadbgError as e:
        return {**d, "verdict": None, "reason": f"not available (the window rerun failed: {_one_line(e)})"}
    except Exception as e:   # an Implementation subclass's own exception, not converted to ImplError
        return {**d, "verdict": None, "reason": f"not available (the implementation raised on the window rerun: "
                                                 f"{type(e).__name__}: {_one_line(e)})"}
    # the reference (and the floor) on the window as the implementation's backward received it: its seed dht and
    # do rounded where it takes them in 16 bits (impls.base.as_received)
    w_ref_in = as_received(w_in, wrun.upstream) or w_in
    wref = run_reference(w_ref_in, config, taps=TAP_ORDER, device=device)
    wct = chunk_table(1, w_in.shape[1], None, config.chunk_size)
    winfo = ChunkInfo.from_table(wct)
    floor = None
    if precision is not None:
        from .noise import floor_reference

        floor = floor_reference(w_ref_in, config, precision, TAP_ORDER, device)
    wcells = window_cells(wrun, wref, wct, winfo, config, list(range(nwc)), heads, tols, w_in.group, floor,
                          storage_tols)
    if name not in wcells:
        return {**d, "verdict": None, "reason": f"--impl {impl.name} gave no {name} in the window"}
    c = wcells[name]
    j = c.chunks.index(chunk - start)
    col = c.column(heads[0])
    failing = bool(c.failing[j, col])  # still over its tolerance, DRIFT or BUG
    wres = DiffResult("window", (impl.name, "reference"), "", device, None, config, winfo, list(range(nwc)),
                      heads, wcells, drift_fails=drift_fails)
    # where the fault went: a BUG cell with a chunk only (noise, DRIFT, does not move, nor does a per-head sum)
    wfirst = wres.first_chunk_bug
    if wfirst is not None:   # the window's coordinates -> the dump's
        g = wfirst["chunk"] + start
        wfirst = {**wfirst, "chunk": g, "seq": n, "chunk_in_seq": info.t[g],
                  "token": None if wfirst.get("token") is None else info.start[start] + wfirst["token"]}
    from .noise import LABELS

    return {**d, "verdict": "introduced" if failing else "inherited", "tap": name, "chunk": chunk,
            "ratio": float(c.ratio[j, col]), "tol": c.tol, "label": LABELS[int(c.label[j, col])],
            "floor": None if c.floor is None else float(c.floor[j, col]),
            # a cell that compared nothing (NaN/Inf on both sides) has no ratio: null, as the diff's own cells
            "ratios": {k: [float(x) if int(n) > 0 and math.isfinite(float(x)) else None
                           for x, n in zip(v.ratio[:, v.column(heads[0])], v.count[:, v.column(heads[0])])]
                       for k, v in wcells.items() if v.quantity.kind != "head"},
            "first_in_window": wfirst}


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def window_cells(run: ImplRun, ref, ct, info: ChunkInfo, config: KDAConfig, chunks: list[int], heads: list[int],
                 tols: dict[str, float], group: int = 1, floor: tuple | None = None,
                 storage_tols: dict[str, float] | None = None) -> dict:
    """Taps and output rows of a window run against the window's reference; ``heads`` are value heads
    (``group``: value heads per q/k head, for the dq/dk rows). ``floor``: ``(outputs, taps)`` of the noise
    floor's run on the window (``noise.floor_reference``), each value stored as the implementation stores
    it; None: no floor (every cell over its tolerance a BUG)."""
    from .impls.base import stored_as

    fl_out, fl_taps = floor if floor is not None else (None, None)
    cand = {k: v.detach() for k, v in run.taps.items() if k in ref.taps and not all_nan(v)}
    rows = [c for c in chunks if c in run.tap_chunks]
    cells = {}
    if cand and rows:
        ri = [run.tap_chunks.index(c) for c in rows]
        hi = [run.tap_heads.index(h) for h in heads if h in run.tap_heads]
        if hi:
            cand = select(cand, ri, hi)
            th = [h for h in heads if h in run.tap_heads]
            refs = select({k: ref.taps[k] for k in cand}, rows, th)
            ftaps = None if fl_taps is None else \
                select({k: stored_as(fl_taps[k], run.tap_storage.get(k)) for k in cand if k in fl_taps}, rows, th)
            gc = select({"gc": ref.taps["gc"]}, rows, th)["gc"] if "gc" in ref.taps else None
            cells.update(compare_cells(cand, refs, {k: rows for k in cand}, th, info, tols, ftaps, gc=gc))
    mine, ids = output_rows({k: v for k, v in run.outputs.items() if k in ref.outputs}, ct, config.state_layout,
                            chunks, heads, group)
    theirs, _ = output_rows({k: ref.outputs[k] for k in mine}, ct, config.state_layout, chunks, heads, group)
    frows = None
    if fl_out is not None:
        frows, _ = output_rows({k: stored_as(fl_out[k], run.outputs[k].dtype) for k in mine if k in fl_out}, ct,
                               config.state_layout, chunks, heads, group)
    cells.update(compare_cells(mine, theirs, ids, heads, info, tols, frows, group=group,
                               storage_tols={k: v for k, v in (storage_tols or {}).items() if k in mine}))
    return cells


def amplification(res: DiffResult, first: dict) -> list[dict]:
    """Error growth along the diverging sequence for the diverging quantity, ``S`` and ``dS`` (head of
    the divergence): per chunk in that quantity's walk direction, from the divergence on (S and dS: the
    whole walk)."""
    if first["chunk"] is None:
        return []
    n = first["seq"]
    # dq/dk under GVA: first["head"] is a q/k head; S and dS are followed on the group's first value head
    head = (first.get("value_heads") or [first["head"]])[0]
    out = []
    for name in dict.fromkeys((first["tap"], "S", "dS")):
        j = res.cells[name].column(head) if name in res.cells else None
        if j is None:
            continue
        cells = res.cells[name]
        seq_rows = [r for r, c in enumerate(cells.chunks) if c is not None and res.info.seq[c] == n]
        backward = cells.stage.startswith("bwd")
        seq_rows.sort(key=lambda r: -cells.chunks[r] if backward else cells.chunks[r])
        if name == first["tap"]:
            seq_rows = [r for r in seq_rows if (cells.chunks[r] <= first["chunk"] if backward
                                                else cells.chunks[r] >= first["chunk"])]
        ratios = [float(cells.ratio[r, j]) for r in seq_rows]
        growth = [(b / a if a > 0 and math.isfinite(a) and math.isfinite(b) else None)
                  for a, b in zip(ratios, ratios[1:])]
        h = cells.heads[j]
        out.append({"tap": name, "head": h, "direction": "backward" if backward else "forward",
                    **({"value_heads": list(range(h * cells.group, (h + 1) * cells.group))} if cells.group > 1
                       else {}),   # dq/dk under GVA: a q/k head, named with its value heads
                    "chunks": [cells.chunks[r] for r in seq_rows], "ratios": ratios, "growth": growth,
                    "labels": [noise.LABELS[int(cells.label[r, j])] for r in seq_rows]})
    return out


# NaN / Inf: the exponent arguments per chunk


def exponent_ranges(ref_taps: dict, info: ChunkInfo, chunks: list[int], heads: list[int],
                    first_chunk: int = 0) -> list[dict]:
    """Per chunk, over its valid rows and the given heads: the range of the arguments of every ``exp``
    the chunked algorithm takes (``gc`` in qd/kd, ``gT - gc`` in kr, ``-gc`` in ki, ``gT`` in the state
    decay), from the reference (row 0 of its taps: chunk ``first_chunk``); ``overflow_fp32`` when one
    exceeds ln(max float32) ≈ 88.7."""
    if "gc" not in ref_taps or "gT" not in ref_taps or not chunks:
        return []
    sel = select({"gc": ref_taps["gc"], "gT": ref_taps["gT"]}, [c - first_chunk for c in chunks], heads)
    gc, gT = sel["gc"].to(torch.float64), sel["gT"].to(torch.float64)            # [R,Hs,C,K], [R,Hs,K]
    lengths = torch.tensor([info.length[c] for c in chunks], device=gc.device)
    valid = (torch.arange(gc.shape[2], device=gc.device)[None, :] < lengths[:, None])[:, None, :, None]

    def span(x):  # (min, max) over the valid rows of every head, per chunk
        inf = torch.tensor(float("inf"), dtype=x.dtype, device=x.device)
        lo = torch.where(valid, x, inf).amin(dim=(1, 2, 3))
        hi = torch.where(valid, x, -inf).amax(dim=(1, 2, 3))
        return list(zip(lo.tolist(), hi.tolist()))

    cols = {"gc": span(gc), "gT_minus_gc": span(gT[:, :, None, :] - gc), "neg_gc": span(-gc),
            "gT": list(zip(gT.amin(dim=(1, 2)).tolist(), gT.amax(dim=(1, 2)).tolist()))}
    out = []
    for i, c in enumerate(chunks):
        row = {"chunk": c, "seq": info.seq[c], **{k: list(v[i]) for k, v in cols.items()}}
        row["max_exponent"] = max(row["gc"][1], row["gT_minus_gc"][1], row["neg_gc"][1])
        row["overflow_fp32"] = row["max_exponent"] > EXP_LIMIT_FP32
        out.append(row)
    return out


# determinism


def repeat_report(runs: list[ImplRun], info: ChunkInfo) -> dict:
    """The first tap × chunk (dataflow order) whose bits differ between run 1 and a later run, else the
    first output × chunk that differs (:func:`first_output_difference`); ``taps_compared``: whether run 1
    returned taps to compare."""
    base = runs[0]
    pairs = sorted(((n, r) for n in base.taps if n in TAP_ORDER for r in range(len(base.tap_chunks))),
                   key=lambda p: dataflow_key(p[0], base.tap_chunks[p[1]], info))
    for i, run in enumerate(runs[1:], start=2):
        for name, r in pairs:
            diff = bits_differ(base.taps[name][r], run.taps[name][r])
            if bool(diff.any()):
                per_head = diff.reshape(diff.shape[0], -1).any(-1)
                return {"runs": len(runs), "identical": False, "run": i, "tap": name, "chunk": base.tap_chunks[r],
                        "head": base.tap_heads[int(per_head.nonzero()[0])], "elements": int(diff.sum())}
        where = first_output_difference(base.outputs, run.outputs, info)
        if where is not None:
            return {"runs": len(runs), "identical": False, "run": i, "tap": None, **where,
                    "taps_compared": bool(pairs)}
    return {"runs": len(runs), "identical": True}


def first_output_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], info: ChunkInfo) -> dict | None:
    """Where outputs ``b`` first differ in bits from ``a``, in dataflow order: ``{"output", "chunk", "head",
    "token", "elements"}`` (``token``: the index within the batch row, the packed one for varlen, for the
    per-token rows, else None; ``chunk`` None for a per-head gradient), or None where every bit agrees."""
    found = []
    for name, x in a.items():
        if name not in b or name not in QUANTITIES:
            continue
        diff = bits_differ(x, b[name])
        if not bool(diff.any()):
            continue
        kind, n = QUANTITIES[name].kind, int(diff.sum())
        if kind == "row" and diff.ndim >= 3:   # [B, T, H, *]: per chunk, its first (head, token) that differs
            at = diff.reshape(*diff.shape[:3], -1).any(-1).nonzero()        # [n, 3]: batch row, token, head
            chunk_of = torch.full(diff.shape[:2], -1, dtype=torch.long, device=diff.device)   # each token's chunk
            for c in info.start:
                chunk_of[0 if diff.shape[0] == 1 else info.seq[c], info.start[c]:info.start[c] + info.length[c]] = c
            cs = chunk_of[at[:, 0], at[:, 1]]
            for c in cs.unique().tolist():
                h, t = min((h, t) for t, h in at[cs == c][:, 1:].tolist())
                found.append((name, None if c < 0 else c, h, t, n))
        elif kind == "seq" and diff.ndim >= 2:   # [N, H, *]: ht at a sequence's last chunk, dh0 at its first
            for seq, h in diff.reshape(*diff.shape[:2], -1).any(-1).nonzero().tolist():
                chunks = info.seq_chunks(seq)
                found.append((name, (chunks[-1] if name == "ht" else chunks[0]) if chunks else None, h, None, n))
        else:   # per head (dA_log [HV], ddt_bias [HV*K]): the head from the first differing element
            heads = a["o"].shape[2] if "o" in a and a["o"].ndim == 4 else 0
            i = int(diff.reshape(-1).nonzero()[0])
            found.append((name, None, i // (diff.numel() // heads) if heads and diff.numel() % heads == 0 else None,
                          None, n))
    if not found:
        return None
    name, chunk, head, token, n = min(found, key=lambda f: (dataflow_key(f[0], f[1], info), f[2], f[3] or 0))
    return {"output": name, "chunk": chunk, "head": head, "token": token, "elements": n}


def bits_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.detach().to("cpu").contiguous(), b.detach().to("cpu").contiguous()
    if a.shape != b.shape or a.dtype != b.dtype:
        return torch.ones(a.shape, dtype=torch.bool)
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.view(ints) != b.view(ints)
