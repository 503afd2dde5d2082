"""What to export or compare: tap names, a chunk range and heads, parsed from strings and checked
against a dump's sizes. Shared by every command that takes ``--taps``, ``--chunks``, ``--heads``.
"""

from __future__ import annotations

from kdadbg_kernels.taps import REGISTRY, STAGES, TAP_NAMES, TapSelection

from .errors import KdadbgError


def parse_tap_names(spec: str | None) -> tuple[str, ...]:
    """``"dS,dgc"`` -> the names in registry order. Accepts tap names, stage names (every tap of the
    stage), ``all`` (the default when ``spec`` is None) and ``none``."""
    if spec is None or spec.strip() == "all":
        return TAP_NAMES
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        raise KdadbgError(f"--taps: expected tap or stage names, all or none, found {spec!r} (names nothing)")
    if items == ["none"]:
        return ()
    chosen = set()
    for item in items:
        if item in REGISTRY:
            chosen.add(item)
        elif item in STAGES:
            chosen.update(t for t in TAP_NAMES if REGISTRY[t].stage == item)
        else:
            raise KdadbgError(f"--taps: unknown tap {item!r}{_did_you_mean(item)}; known taps: {', '.join(TAP_NAMES)} "
                              f"(or a stage: {', '.join(STAGES)}; or all, none)")
    return tuple(t for t in TAP_NAMES if t in chosen)


def _did_you_mean(item: str, known=None) -> str:
    """`` (did you mean dS?)`` for a near miss among ``known`` (default the taps and stages; case, or a close
    spelling), else nothing: taps differ by case alone (``S``, ``dS``; ``L``, ``dL``), so a name matching without
    case is named first."""
    import difflib

    known = (*TAP_NAMES, *STAGES) if known is None else tuple(known)
    near = [n for n in known if n.lower() == item.lower()] or difflib.get_close_matches(item, known, n=2, cutoff=0.75)
    return f" (did you mean {' or '.join(near)}?)" if near else ""


def parse_chunk_range(spec: str | None) -> tuple[int | None, int | None] | None:
    """``"A:B"`` (half-open, either side optional) or ``"A"`` (one chunk) -> ``(A, B)``; ``":"`` is every
    chunk (None), and so is None (the option not given). An empty ``spec`` selects nothing: refused."""
    if spec is None or spec.strip() == ":":
        return None
    text = spec.strip()
    if not text:
        raise KdadbgError(f"--chunks: expected A:B (half-open, either side optional) or A, found {spec!r} "
                          f"(selects nothing; ':' or no --chunks is every chunk)")
    parts = text.split(":")
    try:
        if len(parts) == 1:
            lo = int(parts[0])
            bounds = (lo, lo + 1)
        elif len(parts) == 2:
            bounds = tuple(int(p) if p.strip() else None for p in parts)
        else:
            raise ValueError
    except ValueError:
        raise KdadbgError(f"--chunks: expected A:B (half-open, either side optional) or A, found {spec!r}") from None
    if any(b is not None and b < 0 for b in bounds):
        raise KdadbgError(f"--chunks: expected non-negative chunk ids, found {spec!r}")
    lo, hi = bounds
    if lo is not None and hi is not None and lo >= hi:
        raise KdadbgError(f"--chunks: expected A < B, found {spec!r}")
    return bounds


def parse_heads(spec: str | None) -> tuple[int, ...] | None:
    """``"0,3"`` -> ``(0, 3)``; None (the option not given) or ``"all"`` means every head. An empty
    ``spec`` names no head: refused, as ``","`` is."""
    if spec is None or spec.strip() == "all":
        return None
    try:
        heads = tuple(int(s) for s in spec.split(","))
    except ValueError:
        empty = " (names no head; 'all' or no --heads is every head)" if not spec.replace(",", "").strip() else ""
        raise KdadbgError(f"--heads: expected comma-separated head indices, found {spec!r}{empty}") from None
    if len(set(heads)) != len(heads):
        raise KdadbgError(f"--heads: expected distinct heads, found {spec!r}")
    return heads


def resolve_selection(names: tuple[str, ...], chunks: tuple[int | None, int | None] | None,
                      heads: tuple[int, ...] | None, n_chunks: int, n_heads: int, gva: bool = False) -> TapSelection:
    """A concrete ``TapSelection`` for a dump with ``n_chunks`` chunks and ``n_heads`` heads: its value
    heads (``gva``: a grouped-value-heads dump, whose HV value heads outnumber the q/k heads)."""
    lo, hi = 0, n_chunks
    if chunks is not None:
        lo = chunks[0] if chunks[0] is not None else 0
        hi = min(chunks[1], n_chunks) if chunks[1] is not None else n_chunks
        if lo >= hi:
            want = f"{'' if chunks[0] is None else chunks[0]}:{'' if chunks[1] is None else chunks[1]}"
            raise KdadbgError(f"--chunks {want!r} selects no chunk; the dump has {n_chunks} chunks "
                              f"(ids 0 to {n_chunks - 1})")
    if heads is not None:
        bad = [h for h in heads if not 0 <= h < n_heads]
        if bad:
            what = "HV" if gva else "H"
            raise KdadbgError(f"--heads: head {bad[0]} out of range; the dump has {what}={n_heads} "
                              f"({'value ' if gva else ''}heads 0 to {n_heads - 1})")
    return TapSelection(names=names, chunks=(lo, hi), heads=heads)
