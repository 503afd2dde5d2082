"""Dump format v1: one safetensors file holding a KDA call's inputs, ``do`` and its config.

Tensors (float: bf16, fp16, fp32 or fp64 unless noted)::

    q, k  [B,T,H,K]     g  [B,T,HV,K]     v, do  [B,T,HV,V]     beta  [B,T,HV]
    h0, dht  [N,HV,V,K] (state_layout=vk) or [N,HV,K,V] (kv)     optional
    cu_seqlens [N+1] int32/int64, needs B == 1                  optional
    A_log [HV], dt_bias [HV,K] or [HV*K]   required by the lower_bound and softplus gates

H is q's head count, HV v's: HV = H, or a multiple of H for grouped value heads (GVA, fla's
``num_v_heads > num_heads``), where value head ``hv`` uses q/k head ``hv // (HV/H)``. Nothing in the
config says which: HV is read from v. N = B without ``cu_seqlens``, else ``len(cu_seqlens) - 1``. The
config lives in the ``__metadata__`` strings (see ``kdadbg.config``). ``load_dump`` validates every
tensor before returning; each problem is one ``KdadbgError`` line naming the file, the tensor, what
was expected and what was found. Tensors with other names are ignored (``describe_dump`` lists them).
"""

from __future__ import annotations

import math

from pathlib import Path

import torch

from .chunks import chunk_table
from .config import CHUNK_SIZES, CONFIG_KEYS, GATES, LAYOUTS, KDAConfig, KDAInputs, parse_config, value_problem
from .errors import KdadbgError
from .fileio import TensorSpec, atomic_save, read_header, read_tensors

KERNEL_MAX_HEAD_DIM = 256  # kdadbg_kernels.chunk.MAX_HEAD_DIM (not imported: that import picks the Triton mode)
REQUIRED = ("q", "k", "v", "g", "beta", "do")
KNOWN = KDAInputs.TENSORS
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
INT_DTYPES = (torch.int32, torch.int64)
VALUE_ORDER = tuple(n for n in KNOWN if n != "cu_seqlens")  # finiteness; check_layout reads the offsets
GATE_PARAMS = {"none": (), "lower_bound": ("A_log", "dt_bias"), "softplus": ("A_log", "dt_bias")}
GATE_FORMULA = {"lower_bound": "lower_bound*sigmoid(exp(A_log)*(g + dt_bias))",
                "softplus": "-exp(A_log)*softplus(g + dt_bias)"}


def load_dump(path, overrides: dict | None = None, allow_nonfinite: bool = False) -> tuple[KDAInputs, KDAConfig]:
    """Read and validate a dump; ``overrides`` (config key -> value, None = keep) beat the file's config.

    Shapes, dtypes and config are checked from the file's header before any tensor is read; tensors
    that are not part of the format are never read. Returns the inputs in the dump's dtypes
    (``cu_seqlens`` as int64) and the resolved config.
    Example: ``inputs, config = load_dump("sample_inputs/basic.safetensors", {"chunk_size": 32})``.
    """
    specs, meta = read_header(path)
    cu = read_tensors(path, ["cu_seqlens"])["cu_seqlens"] if "cu_seqlens" in specs else None
    config = check_layout(str(path), specs, meta, overrides, cu_seqlens=cu)
    tensors = read_tensors(path, [n for n in KNOWN if n in specs])
    for name in VALUE_ORDER:
        if name in tensors:
            check_values(str(path), name, tensors[name], specs["q"].shape[1], allow_nonfinite)
    return _inputs(tensors), config


# metadata keys a dump may hold besides the config (CONFIG_KEYS): gen's notes and capture's ``capture.*``
NOTE_KEYS = ("preset", "seed", "format", "kdadbg")
NOTE_PREFIXES = ("capture.", "size_")


def unknown_metadata(meta: dict) -> list[str]:
    """The metadata keys of a dump that kdadbg does not read, each with the config key it may be meant as
    (``chunksize (chunk_size?)``): a misspelt config key otherwise falls back to its default without a word."""
    import difflib

    out = []
    for key in meta:
        if key in CONFIG_KEYS or key in NOTE_KEYS or key.startswith(NOTE_PREFIXES):
            continue
        norm = key.lower().replace("-", "_").replace(" ", "_")
        near = [k for k in CONFIG_KEYS if k == norm or k.replace("_", "") == norm.replace("_", "")] or \
            difflib.get_close_matches(norm, CONFIG_KEYS, n=1, cutoff=0.8)
        out.append(f"{key} ({near[0]}?)" if near else key)
    return out


def extra_tensors_note(path) -> str | None:
    """A note naming the tensors of dump ``path`` that are not part of the format and the metadata keys that
    are not read (a misspelt optional input, ``initial_state`` for ``h0``, or config key, ``chunksize``,
    would otherwise vanish without a word); None when there are none."""
    specs, meta = read_header(path)
    extra = [n for n in specs if n not in KNOWN]
    keys = unknown_metadata(meta)
    parts = []
    if extra:
        optional = [n for n in KNOWN if n not in REQUIRED]
        absent = [n for n in optional if n not in specs]
        parts.append(f"holds {len(extra)} tensor(s) that are not dump inputs, not read: {', '.join(extra[:12])}"
                     f"{', ...' if len(extra) > 12 else ''} (the optional inputs are named {', '.join(optional)}"
                     + (f"; absent here: {', '.join(absent)})" if absent else ")"))
    if keys:
        parts.append(f"metadata keys not read: {', '.join(keys[:12])}{', ...' if len(keys) > 12 else ''} (the "
                     f"config keys are {', '.join(CONFIG_KEYS)})")
    return f"{path}: {'; '.join(parts)}" if parts else None


NO_UPSTREAM = ("not compared: the dump's do is all zero and it has no nonzero dht, so every gradient is 0 "
               "whatever the backward computes")


def no_upstream_gradient(inputs) -> bool:
    """Whether the dump's upstream gradients are all zero (``do`` everywhere, ``dht`` absent or zero): its
    gradients then hold nothing to judge a backward by (0 against 0 passes any backward; a frozen or masked
    layer's captured step can be so)."""
    if bool(inputs.do.ne(0).any()):
        return False
    return inputs.dht is None or not bool(inputs.dht.ne(0).any())


# a captured call that asked for no final state (output_final_state=False, as training does) returned no ht:
# nothing to compare, and no shortfall of the implementation's either (not "partial")
NOT_ASKED = "not computed by the captured call, which asked for no final state"


NO_UPSTREAM_RECEIVED = ("not compared: do as the implementation's backward received it (rounded to its output's "
                        "16-bit dtype) is all zero and no nonzero dht reached it, so every gradient is 0 whatever "
                        "the backward computes: the dump's upstream gradient is below what that dtype holds")


def blind_gradients(inputs, names, dump_inputs=None) -> dict[str, str]:
    """The gradients among ``names`` that the dump cannot judge, each with why (``NO_UPSTREAM``): all of them
    where it has no upstream gradient (:func:`no_upstream_gradient`), else none. ``run`` and ``diff`` report
    them not compared (the verdict at best partial) rather than compare 0 with 0. ``inputs``: the upstream
    as the implementation received it (``impls.base.as_received``); ``dump_inputs``, the dump's, where that
    differs: all zero only as received, the reason says the rounding did it."""
    from kdadbg_kernels.taps import GRADIENTS

    if not no_upstream_gradient(inputs):
        return {}
    why = NO_UPSTREAM if dump_inputs is None or no_upstream_gradient(dump_inputs) else NO_UPSTREAM_RECEIVED
    return {n: why for n in names if n in GRADIENTS}


def kernel_precheck(path) -> str | None:
    """Before a command runs our kernels on the dump ``path``, from its header alone: refuse head
    dims over the kernels' limit; return a note when float64 inputs will run cast to float32
    (None otherwise). A file that is not a readable dump is left to the loader's message."""
    try:
        specs, _ = read_header(path)
    except KdadbgError:
        return None
    q, v = specs.get("q"), specs.get("v")
    if q is None or v is None or q.ndim != 4 or v.ndim != 4:
        return None
    check_kernel_dims(str(path), q.shape[-1], v.shape[-1])
    wide = [n for n in KNOWN if n in specs and specs[n].dtype == torch.float64]
    if not wide:
        return None
    return (f"{path}: float64 inputs ({', '.join(wide)}): our kernels take float32, bfloat16 or float16, so they "
            f"run on these cast to float32; the reference uses the float64 values")


def check_kernel_dims(where: str, K: int, V: int) -> None:
    """Our kernels take head dims K, V up to ``KERNEL_MAX_HEAD_DIM``; the reference takes any."""
    for name, dim, tensor in (("K", K, "q"), ("V", V, "v")):
        if dim > KERNEL_MAX_HEAD_DIM:
            raise KdadbgError(f"{where}: tensor '{tensor}': head dim {name}={dim}: our kernels take K, V up to "
                              f"{KERNEL_MAX_HEAD_DIM}; the float64 reference takes any "
                              f"(kdadbg taps --source reference)")


def kernel_inputs(inputs: KDAInputs, where: str = "dump") -> KDAInputs:
    """``inputs`` as our kernels take them: float64 tensors cast to float32 (the kernels take
    float32, bfloat16 and float16), head dims checked against ``KERNEL_MAX_HEAD_DIM``."""
    B, T, H, K, V = inputs.shape
    check_kernel_dims(where, K, V)
    return KDAInputs(**{n: t.to(torch.float32) if t.dtype == torch.float64 else t for n, t in inputs.items()})


def save_dump(path, inputs: KDAInputs, config: KDAConfig, force: bool = False,
              notes: dict[str, str] | None = None) -> Path:
    """Validate, then write ``inputs`` and ``config`` as a v1 dump (atomically; no overwrite without
    ``force``). ``notes`` are extra metadata strings (e.g. how the dump was made)."""
    meta = {**(notes or {}), **config.to_metadata()}
    tensors = dict(inputs.items())
    validate(str(path), tensors, meta, None, allow_nonfinite=True)
    return atomic_save(tensors, meta, path, force=force)


def apply_overrides(config: KDAConfig, overrides: dict | None, where: str = "dump") -> KDAConfig:
    """``config`` with the non-None ``overrides`` applied, each checked like a metadata value."""
    kw = {k: v for k, v in (overrides or {}).items() if v is not None}
    for key, value in kw.items():
        if key not in CONFIG_KEYS:
            raise KdadbgError(f"{where}: config override {key!r}: unknown key; known: {', '.join(CONFIG_KEYS)}")
        ok = {"chunk_size": lambda v: v in CHUNK_SIZES, "gate": lambda v: v in GATES,
              "state_layout": lambda v: v in LAYOUTS,
              "scale": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "lower_bound": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "qk_l2norm": lambda v: isinstance(v, bool), "beta_sigmoid": lambda v: isinstance(v, bool)}[key]
        if not ok(value):
            expected = {"chunk_size": "one of 16, 32, 64", "gate": "one of " + ", ".join(GATES),
                        "state_layout": "one of " + ", ".join(LAYOUTS)}.get(key, "a number" if key in (
                            "scale", "lower_bound") else "true or false")
            raise KdadbgError(f"{where}: config override {key}: expected {expected}, found {value!r}")
    kw = {k: float(v) if k in ("scale", "lower_bound") else v for k, v in kw.items()}
    for key in ("scale", "lower_bound"):
        problem = value_problem(key, kw[key]) if key in kw else None
        if problem:
            raise KdadbgError(f"{where}: config override {key} (--{key.replace('_', '-')}): expected {problem}, "
                              f"found {kw[key]!r}")
    return config.with_overrides(**kw)


def _head_first_hint(name: str, found, q_shape, expected) -> str:
    """Where ``name``'s shape is the expected one with T and H (dims 1 and 2) swapped: which side looks
    head-first (``[B,H,T,*]``, as fla's older ``head_first=True`` took): ``q`` (and the tensors read with it)
    where q, read as fla's ``[B,T,H,K]``, has more heads than tokens, else ``name``. "" otherwise."""
    found, expected = tuple(found), tuple(expected)
    if len(found) < 3 or expected[1] == expected[2] or found[:3] != (expected[0], expected[2], expected[1]) \
            or (name != "v" and found[3:] != expected[3:]):
        return ""
    B, T, H, K = q_shape
    if H > T:
        return (f"; q looks head-first: [B,H,T,K] = {_fmt((B, T, H, K))} instead of [B,T,H,K] (read as T={T} tokens, "
                f"H={H} heads), which would explain {name}'s shape: kdadbg takes fla's [B,T,H,*]; transpose q, k, v, "
                f"g and do (dims 1 and 2)")
    sym = "[B,H,T]" if len(found) == 3 else "[B,H,T,*]"
    return f"; {name} looks head-first ({sym}, T and H swapped): transpose its dims 1 and 2 to fla's [B,T,H,*]"


def _fmt(shape) -> str:
    return "[" + ",".join(str(int(s)) for s in shape) + "]"


def _dtype(dt) -> str:
    return str(dt).removeprefix("torch.")


def validate(where: str, tensors: dict[str, torch.Tensor], meta: dict[str, str], overrides: dict | None = None,
             allow_nonfinite: bool = False) -> tuple[KDAInputs, KDAConfig]:
    """Check a dump's tensors and metadata (see the module docstring); ``where`` names the file."""
    config = check_layout(where, {n: TensorSpec.of(t) for n, t in tensors.items()}, meta, overrides,
                          cu_seqlens=tensors.get("cu_seqlens"))
    for name in VALUE_ORDER:
        if name in tensors:
            check_values(where, name, tensors[name], tensors["q"].shape[1], allow_nonfinite)
    return _inputs(tensors), config


def _inputs(tensors: dict[str, torch.Tensor]) -> KDAInputs:
    out = {n: tensors[n] for n in KNOWN if n in tensors}
    if "cu_seqlens" in out:
        out["cu_seqlens"] = out["cu_seqlens"].to(torch.int64)
    return KDAInputs(**out)


def _err(where, name, msg) -> KdadbgError:
    return KdadbgError(f"{where}: tensor '{name}': {msg}")


def check_layout(where: str, specs: dict, meta: dict[str, str], overrides: dict | None = None,
                 cu_seqlens: torch.Tensor | None = None) -> KDAConfig:
    """Everything a dump's header decides (names, dtypes, shapes, config; ``specs``: name ->
    ``TensorSpec``), and the ``cu_seqlens`` offsets (small, read first), before any other tensor is
    read; returns the resolved config."""
    def err(name, msg):
        return _err(where, name, msg)

    for name in REQUIRED:
        if name not in specs:
            from .tapsfile import taps_file_kind, written_by

            kind = taps_file_kind(meta, specs)
            if kind is not None:   # a taps file said "q missing (found: none)" of its 39 tensors
                raise KdadbgError(f"{where}: is a taps file (taps and outputs of one run, {written_by(kind, meta)}), "
                                  f"not a dump of inputs; pass the dump it came from (a taps file goes to `diff DUMP "
                                  f"--against FILE` or `diff A B`; `kdadbg inspect` describes it)")
            found = ", ".join(n for n in KNOWN if n in specs) or "none"
            unknown = [n for n in specs if n not in KNOWN]
            extra = f"; it holds {len(unknown)} other tensor(s): {', '.join(unknown[:8])}" if unknown else ""
            raise err(name, f"missing; a dump needs {', '.join(REQUIRED)} (found: {found}{extra})")
    for name in KNOWN:
        if name not in specs:
            continue
        dt = specs[name].dtype
        if name == "cu_seqlens":
            if dt not in INT_DTYPES:
                raise err(name, f"expected an integer dtype (int32 or int64), found {_dtype(dt)}")
        elif dt not in FLOAT_DTYPES:
            raise err(name, f"expected a float dtype (bfloat16, float16, float32 or float64), "
                            f"found {_dtype(dt)}")

    q = specs["q"]
    if q.ndim != 4 or q.numel() == 0:
        raise err("q", f"expected shape [B,T,H,K] with 4 non-empty dims, found {_fmt(q.shape)}")
    B, T, H, K = q.shape
    config = parse_config(meta, K, "A_log" in specs, where=where)
    config = apply_overrides(config, overrides, where)

    v = specs["v"]
    if v.ndim != 4 or tuple(v.shape[:2]) != (B, T) or v.shape[3] == 0 or v.shape[2] == 0 or v.shape[2] % H:
        raise err("v", f"expected shape [B,T,H,V] = [{B},{T},{H},*] (B,T,H from q) or, for grouped value heads, "
                       f"[B,T,HV,V] with HV a multiple of H={H}, found {_fmt(v.shape)}"
                       f"{_head_first_hint('v', v.shape, q.shape, (B, T, H))}")
    HV, V = v.shape[2], v.shape[3]
    gva = HV != H
    hv = "HV" if gva else "H"
    hv_src = f"HV={HV} from v" if gva else "H from q"
    expect = {"k": ((B, T, H, K), "[B,T,H,K]", "from q"),
              "g": ((B, T, HV, K), f"[B,T,{hv},K]", f"B,T,K from q, {hv_src}" if gva else "from q"),
              "do": ((B, T, HV, V), f"[B,T,{hv},V]", "B,T from q, HV,V from v" if gva else "B,T,H,K from q, V from v"),
              "beta": ((B, T, HV), f"[B,T,{hv}]", f"B,T from q, {hv_src}" if gva else "from q"),
              "A_log": ((HV,), f"[{hv}]", hv_src)}
    for name, (shape, sym, src) in expect.items():
        if name in specs and tuple(specs[name].shape) != shape:
            raise err(name, f"expected shape {sym} = {_fmt(shape)} ({src}), found {_fmt(specs[name].shape)}"
                            f"{_head_first_hint(name, specs[name].shape, q.shape, shape) if name != 'A_log' else ''}")
    if "dt_bias" in specs and tuple(specs["dt_bias"].shape) not in ((HV, K), (HV * K,)):
        src = hv_src + ", K from q" if gva else "H,K from q"
        raise err("dt_bias", f"expected shape [{hv},K] = {_fmt((HV, K))} or fla's flat [{hv}*K] = [{HV * K}] "
                             f"({src}), found {_fmt(specs['dt_bias'].shape)}")

    cu = specs.get("cu_seqlens")
    if cu is not None:
        if cu.ndim != 1 or cu.numel() < 2:
            raise err("cu_seqlens", f"expected shape [N+1] with N >= 1, found {_fmt(cu.shape)}")
        if B != 1:
            raise err("cu_seqlens", f"expected B == 1 (varlen packs the sequences in one row), found B={B} in q")
        if cu_seqlens is not None:
            check_values(where, "cu_seqlens", cu_seqlens, T)
    N = B if cu is None else cu.numel() - 1

    state = (N, HV, V, K) if config.state_layout == "vk" else (N, HV, K, V)
    sym = f"[N,{hv},V,K]" if config.state_layout == "vk" else f"[N,{hv},K,V]"
    for name in ("h0", "dht"):
        t = specs.get(name)
        if t is None:
            continue
        if t.ndim == 4 and t.shape[0] != N:
            seqs = "len(cu_seqlens)-1" if cu is not None else "B"
            raise err(name, f"expected one state per sequence, N={N} ({seqs}), found {t.shape[0]} "
                            f"(shape {_fmt(t.shape)})")
        if tuple(t.shape) != state:
            hint = ""
            other = (N, HV, K, V) if config.state_layout == "vk" else (N, HV, V, K)
            if tuple(t.shape) == other:
                hint = f"; that is the {'kv' if config.state_layout == 'vk' else 'vk'} layout, set state_layout"
            raise err(name, f"expected shape {sym} = {_fmt(state)} (state_layout={config.state_layout}), "
                            f"found {_fmt(t.shape)}{hint}")

    for name in GATE_PARAMS[config.gate]:
        if name not in specs:
            raise err(name, f"missing; gate={config.gate} ({GATE_FORMULA[config.gate]}) needs A_log [{hv}] and "
                            f"dt_bias [{hv},K] (or [{hv}*K])")
    return config


def check_values(where: str, name: str, t: torch.Tensor, T: int, allow_nonfinite: bool = False) -> None:
    """What only a tensor's values decide: ``cu_seqlens`` offsets from 0 to ``T``; finite floats
    (unless ``allow_nonfinite``)."""
    if name == "cu_seqlens":
        cu = t.to(torch.int64)
        if int(cu[0]) != 0:
            raise _err(where, name, f"expected to start at 0, found {int(cu[0])}")
        step = cu[1:] - cu[:-1]
        if bool((step < 0).any()):
            i = int(torch.nonzero(step < 0)[0]) + 1
            raise _err(where, name, f"expected non-decreasing offsets, found cu_seqlens[{i}]={int(cu[i])} "
                                    f"< cu_seqlens[{i - 1}]={int(cu[i - 1])}")
        if int(cu[-1]) != T:
            raise _err(where, name, f"expected to end at T={T} (from q), found {int(cu[-1])}")
        return
    if allow_nonfinite or not t.is_floating_point():
        return
    bad = ~torch.isfinite(t)
    n_bad = int(bad.sum())
    if n_bad:
        n_nan = int(torch.isnan(t).sum())
        first = _fmt(torch.nonzero(bad)[0].tolist())
        raise _err(where, name, f"expected finite values, found {n_bad} NaN/Inf ({n_nan} NaN, {n_bad - n_nan} Inf), "
                                f"first at {first} (run, diff and taps take it with --allow-nonfinite; "
                                f"load_dump(..., allow_nonfinite=True))")


_STATS_SLICE = 1 << 22   # elements per slice: the float64 temporaries stay ~100 MB whatever the tensor's size


def _stats(t: torch.Tensor) -> dict:
    """min/max/mean over the finite values and NaN/Inf counts; None for a dtype with no order (complex).
    Taken slice by slice, so that it needs little memory beyond the tensor itself (a float64 copy of a bf16
    tensor is four times its size)."""
    if t.is_complex():
        return {"min": None, "max": None, "mean": None, "nan": None, "inf": None}
    flat = t.detach().flatten()
    lo, hi, total, count, nan, inf = math.inf, -math.inf, 0.0, 0, 0, 0
    for i in range(0, flat.numel(), _STATS_SLICE):
        x = flat[i:i + _STATS_SLICE].to(torch.float64)
        nan += int(torch.isnan(x).sum())
        inf += int(torch.isinf(x).sum())
        xf = x[torch.isfinite(x)]
        if xf.numel():
            lo, hi = min(lo, float(xf.min())), max(hi, float(xf.max()))
            total += float(xf.sum())
            count += xf.numel()
    have = count > 0
    return {"min": lo if have else None, "max": hi if have else None, "mean": total / count if have else None,
            "nan": nan, "inf": inf}


_NO_STATS = {"min": None, "max": None, "mean": None, "nan": None, "inf": None}


def _first_nonfinite(t: torch.Tensor) -> list[int] | None:
    """The index of ``t``'s first NaN/Inf (row-major), slice by slice as :func:`_stats`; None when all finite."""
    flat = t.detach().flatten()
    for i in range(0, flat.numel(), _STATS_SLICE):
        bad = torch.nonzero(~torch.isfinite(flat[i:i + _STATS_SLICE]))
        if bad.numel():
            return [int(j) for j in torch.unravel_index(torch.tensor(i + int(bad[0])), tuple(t.shape))]
    return None


def _where(name: str, index: list[int], specs: dict, ct) -> dict:
    """Where element ``index`` of dump tensor ``name`` sits: ``batch``, ``token`` (on the T axis), ``head``
    (value head for g, v, beta, do and the states), ``sequence`` and ``chunk`` where they apply (None
    otherwise; the chunk needs ``ct``, the dump's chunk table, None for an invalid dump)."""
    at = {"batch": None, "token": None, "head": None, "sequence": None, "chunk": None}
    if name in ("q", "k", "v", "g", "beta", "do"):
        b, t, h = index[:3]
        at.update(batch=b, token=t, head=h, sequence=b)
        if ct is not None:
            flat = b * specs["q"].shape[1] + t
            inside = (ct.start <= flat) & (flat < ct.start + ct.length)
            at["chunk"] = int(torch.nonzero(inside)[0]) if bool(inside.any()) else None
            at["sequence"] = int(ct.seq[at["chunk"]]) if at["chunk"] is not None else at["sequence"]
    elif name in ("h0", "dht"):
        at.update(sequence=index[0], head=index[1])
    elif name == "A_log":
        at["head"] = index[0]
    elif name == "dt_bias":
        at["head"] = index[0] if len(index) == 2 else index[0] // specs["q"].shape[-1]
    return at


def _origin(meta: dict) -> dict | None:
    """A file's ``capture.*`` metadata without the prefix, typed as the capture manifest has them."""
    origin = {k.removeprefix("capture."): v for k, v in meta.items() if k.startswith("capture.")}
    for key in ("step", "call", "rank", "pid"):
        if str(origin.get(key, "")).lstrip("-").isdigit():
            origin[key] = int(origin[key])
    if "nonfinite" in origin:
        origin["nonfinite"] = [n for n in str(origin["nonfinite"]).split(",") if n]
    return origin or None


# the dump tensor each output or gradient has the layout of (for saying where a NaN/Inf is)
_LAYOUT_OF = {"o": "v", "dq": "q", "dk": "k", "dv": "v", "dg": "g", "dbeta": "beta", "ht": "h0", "dh0": "h0",
              "dA_log": "A_log", "ddt_bias": "dt_bias"}


def _overrides_for(dump, meta: dict) -> str:
    """The config overrides (`` --gate softplus --chunk-size 32``) that give ``dump`` the config a taps file was
    made with (``taps``/``run`` with overrides record it), so that the command inspect recommends runs; "" when
    they agree, or the dump is not at hand or cannot be read (its own error comes with the command)."""
    from .tapsfile import CONFIG_KEYS as FILE_KEYS, config_overrides

    if dump is None:
        return ""
    try:
        specs, dmeta = read_header(dump)
        config = check_layout(str(dump), specs, dmeta, None)
    except (KdadbgError, OSError):
        return ""
    fix = config_overrides(meta, config.to_metadata(), (*FILE_KEYS, "chunk_size"))
    return f" {fix}" if fix else ""


def _describe_taps_file(path, specs: dict, meta: dict, kind: str, out: dict) -> dict:
    """:func:`describe_dump` for a file of the taps file layout (``kind``: ``tapsfile.taps_file_kind``)."""
    from kdadbg_kernels.taps import OUTPUTS

    from .tapsfile import CHUNK_KEYS, HEAD_KEY, TAP_PREFIX, check_taps_layout

    role = {**{n: "output" for n in OUTPUTS}, **{n: "gradient" for n in _LAYOUT_OF if n not in OUTPUTS},
            **{k: "index" for k in (*CHUNK_KEYS, HEAD_KEY)}}
    rows = {name: {"name": name, "role": role.get(name, "tap" if name.startswith(TAP_PREFIX) else "extra"),
                   "shape": list(spec.shape), "dtype": _dtype(spec.dtype), **_NO_STATS} for name, spec in specs.items()}
    order = {"output": 0, "gradient": 1, "tap": 2, "index": 3, "extra": 4}
    from kdadbg_kernels.taps import TAP_NAMES

    # outputs, gradients, then the taps in dataflow order (the registry's), not alphabetically
    names = [*_LAYOUT_OF, *(TAP_PREFIX + n for n in TAP_NAMES), *CHUNK_KEYS, HEAD_KEY]
    out["tensors"] = sorted(rows.values(), key=lambda r: (order[r["role"]], names.index(r["name"])
                                                          if r["name"] in names else len(names), r["name"]))
    out["extra"] = [r["name"] for r in out["tensors"] if r["role"] == "extra"]
    out["kind"] = "taps file"
    dump = meta.get("dump")
    beside = Path(path).parent / dump if dump else None
    dump_arg = str(beside) if beside is not None and beside.is_file() else "DUMP"
    info = {"written_by": kind, "format": meta.get("format"), "source": meta.get("source"),
            "precision": meta.get("precision"), "dump": dump, "inputs_sha256": meta.get("inputs_sha256"),
            "window": meta.get("chunks"), "outputs": [], "taps": [], "missing_taps": [], "chunks": None,
            "heads": None, "use": f"kdadbg diff {dump_arg} --against {path}"
            + (f" --precision {meta['precision']}" if meta.get("precision") in ("fp32", "bf16") else "")
            + _overrides_for(beside if dump_arg != "DUMP" else None, meta)}
    out["taps_file"] = info
    out["config"] = [{"key": k, "value": meta[k], "default": False} for k in CONFIG_KEYS if k in meta]
    error, first = None, {}
    try:
        index = read_tensors(path, [k for k in (*CHUNK_KEYS, HEAD_KEY) if k in specs])
        layout = check_taps_layout(str(path), specs, meta, index)
        info.update(outputs=layout["outputs"], taps=layout["taps"],
                    missing_taps=layout["missing_taps"] if layout["taps"] else [])
        if layout["heads"] is not None:
            info["chunks"], info["heads"] = layout["chunks"]["index"].tolist(), layout["heads"].tolist()
        for name, r in rows.items():
            if r["role"] == "extra":
                continue
            t = index[name] if name in index else read_tensors(path, [name])[name]
            r.update(_stats(t))
            if r["nan"] or r["inf"]:
                first[name] = _first_nonfinite(t)
            del t
    except KdadbgError as e:
        error = str(e)
    out["nonfinite"] = [{"name": n, "nan": rows[n]["nan"], "inf": rows[n]["inf"], "first": first[n],
                         **_where_in_file(n, first[n], info)} for n in (r["name"] for r in out["tensors"])
                        if n in first]
    out["ok"], out["verdict"] = error is None, error or "valid"
    if info["window"]:
        out["warnings"].append(f"made with --chunks {info['window']}: only those chunks hold values (NaN elsewhere); "
                               f"diff --against compares that window")
    if error is None and not info["outputs"] and not info["taps"]:
        out["warnings"].append("holds no output, gradient nor tap: nothing for diff to compare")
    return out


def _where_in_file(name: str, index: list[int], info: dict) -> dict:
    """:func:`_where` for a taps file's tensor: an output or gradient by the axes of its dump shape (the file
    has no ``cu_seqlens``: no sequence or chunk of a token), a tap's chunk and head from its rows."""
    at = {"batch": None, "token": None, "head": None, "sequence": None, "chunk": None}
    if name in ("o", "dq", "dk", "dv", "dg", "dbeta"):
        at.update(batch=index[0], token=index[1], head=index[2])
    elif name in ("ht", "dh0"):
        at.update(sequence=index[0], head=index[1])
    elif name == "dA_log" or (name == "ddt_bias" and len(index) == 2):
        at["head"] = index[0]
    elif name.startswith("tap.") and info["chunks"] is not None:
        at.update(chunk=info["chunks"][index[0]], head=info["heads"][index[1]])
    return at


def describe_dump(path) -> dict:
    """What ``kdadbg inspect`` shows, as plain data; never raises for a bad dump.

    Reads the header first and then the format's tensors one at a time, so its memory is that of
    the largest tensor it summarises; tensors outside the format are listed, never read.

    Keys: ``path``; ``ok`` (a bool) and ``verdict`` ("valid", as ``inspect`` prints it, or the validation
    error); ``config``: a list of
    ``{key, value, default}`` (None when the metadata cannot be parsed; ``metadata`` holds the raw
    strings); ``sizes``: B, T, H (q/k heads), HV (value heads), K, V, N, n_chunks (when known); ``tensors``: per tensor
    ``{name, role ('input' or 'extra'), shape, dtype, min, max, mean, nan, inf}`` (stats over the
    finite values; None for extra tensors and complex ones); ``extra``: names of tensors that are
    not part of format v1; ``origin``: for a dump written by ``kdadbg.capture``, its ``capture.*``
    metadata without the prefix (``step``, ``call``, ``module``, ``rank``, ``impl``, ...), else None;
    ``unknown_metadata``: the metadata keys not read (``unknown_metadata``); ``warnings``: what makes a valid
    dump a poor test (no upstream gradient); ``nonfinite``: per tensor holding NaN/Inf, ``{name, nan, inf,
    first}`` (the index of its first one) and where that is (``batch, token, head, sequence, chunk``, None
    where they do not apply). NaN/Inf values leave a dump valid (they are a finding: ``run``, ``diff`` and
    ``taps`` take such a dump with ``--allow-nonfinite``), as capture's ``when="nonfinite"`` writes them.
    ``kind``: ``"dump"``, or ``"taps file"`` for a file of the taps file layout (``tapsfile.taps_file_kind``),
    described by its ``taps_file`` entry (who wrote it, source, precision, dump, outputs, taps, chunks, heads,
    the ``diff`` command that uses it) and tensors whose ``role`` is output, gradient, tap, index or extra.
    """
    out = {"path": str(path), "ok": False, "verdict": "", "metadata": {}, "config": None, "sizes": None,
           "tensors": [], "extra": [], "origin": None, "unknown_metadata": [], "warnings": [], "nonfinite": [],
           "kind": "dump", "taps_file": None}
    try:
        specs, meta = read_header(path)
    except KdadbgError as e:
        out["verdict"] = str(e)
        return out
    out["metadata"] = meta
    out["origin"] = _origin(meta)
    from .tapsfile import taps_file_kind

    kind = taps_file_kind(meta, specs)
    if kind is not None:
        return _describe_taps_file(path, specs, meta, kind, out)
    rows = {name: {"name": name, "role": "input" if name in KNOWN else "extra", "shape": list(spec.shape),
                   "dtype": _dtype(spec.dtype), **_NO_STATS} for name, spec in specs.items()}
    order = {n: i for i, n in enumerate(KNOWN)}
    out["tensors"] = sorted(rows.values(), key=lambda r: (order.get(r["name"], len(order)), r["name"]))
    out["extra"] = [r["name"] for r in out["tensors"] if r["role"] == "extra"]

    where, config, error, cu, first = str(path), None, None, None, {}
    try:
        if "cu_seqlens" in specs:
            cu = read_tensors(path, ["cu_seqlens"])["cu_seqlens"]
            rows["cu_seqlens"].update(_stats(cu))
        config = check_layout(where, specs, meta, cu_seqlens=cu)
    except KdadbgError as e:
        error = str(e)
        q = specs.get("q")
        if q is not None and q.ndim == 4 and q.shape[-1] >= 1:
            try:
                config = parse_config(meta, q.shape[-1], "A_log" in specs, where=where)
            except KdadbgError:
                config = None
    try:
        for name in VALUE_ORDER:
            if name not in specs:
                continue
            t = read_tensors(path, [name])[name]
            rows[name].update(_stats(t))
            if rows[name]["nan"] or rows[name]["inf"]:
                first[name] = _first_nonfinite(t)
            del t
    except KdadbgError as e:
        error = error or str(e)
    ct = None
    if error is None:
        B, T, H, K = specs["q"].shape
        HV, V = specs["v"].shape[2:]
        cu = None if cu is None else cu.to(torch.int64)
        ct = chunk_table(B, T, cu, config.chunk_size)
        N = B if cu is None else cu.numel() - 1
        out["sizes"] = {"B": B, "T": T, "H": H, "HV": HV, "K": K, "V": V, "N": N, "n_chunks": ct.n_chunks}
    out["nonfinite"] = [{"name": n, "nan": rows[n]["nan"], "inf": rows[n]["inf"], "first": index,
                         **_where(n, index, specs, ct)} for n, index in first.items()]
    out["ok"], out["verdict"] = error is None, error or "valid"
    out["unknown_metadata"] = unknown_metadata(meta)
    do, dht = rows.get("do"), rows.get("dht")
    zero = (lambda r: r is not None and r["min"] == 0 and r["max"] == 0 and not r["nan"] and not r["inf"])
    out["warnings"] = ["do is all zero and there is no nonzero dht: every gradient is 0 whatever the backward "
                       "computes (run and diff do not compare them)"] \
        if error is None and zero(do) and (dht is None or zero(dht)) else []
    if config is not None:
        out["config"] = [{"key": k, "value": getattr(config, k), "default": k not in meta} for k in CONFIG_KEYS]
    return out
