"""Dump format v1: one safetensors file holding a KDA call's inputs, ``do`` and its config.

Tensors (float: bf16, fp16, fp32 or fp64 unless noted)::

    q, k, g  [B,T,H,K]          v, do  [B,T,H,V]          beta  [B,T,H]
    h0, dht  [N,H,V,K] (state_layout=vk) or [N,H,K,V] (kv)      optional
    cu_seqlens [N+1] int32/int64, needs B == 1                  optional
    A_log [H], dt_bias [H,K]    required by the lower_bound and softplus gates; dt_bias may be
                                fla's flat [H*K] (the file keeps it; KDAInputs holds it as [H,K])

N = B without ``cu_seqlens``, else ``len(cu_seqlens) - 1``. The config lives in the
``__metadata__`` strings (see ``kdadbg.config``). ``load_dump`` validates every tensor before
returning; each problem is one ``KdadbgError`` line naming the file, the tensor, what was
expected and what was found. Tensors with other names are ignored (``describe_dump`` lists them).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .chunks import chunk_table
from .config import CHUNK_SIZES, CONFIG_KEYS, GATES, LAYOUTS, KDAConfig, KDAInputs, parse_config
from .errors import KdadbgError
from .fileio import atomic_save, read_safetensors

REQUIRED = ("q", "k", "v", "g", "beta", "do")
KNOWN = KDAInputs.TENSORS
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
INT_DTYPES = (torch.int32, torch.int64)
GATE_PARAMS = {"none": (), "lower_bound": ("A_log", "dt_bias"), "softplus": ("A_log", "dt_bias")}
GATE_FORMULA = {"lower_bound": "lower_bound*sigmoid(exp(A_log)*(g + dt_bias))",
                "softplus": "-exp(A_log)*softplus(g + dt_bias)"}


def load_dump(path, overrides: dict | None = None, allow_nonfinite: bool = False) -> tuple[KDAInputs, KDAConfig]:
    """Read and validate a dump; ``overrides`` (config key -> value, None = keep) beat the file's config.

    Returns the inputs in the dump's dtypes (``cu_seqlens`` as int64) and the resolved config.
    Example: ``inputs, config = load_dump("sample_inputs/basic.safetensors", {"chunk_size": 32})``.
    """
    tensors, meta = read_safetensors(path)
    return validate(str(path), tensors, meta, overrides, allow_nonfinite)


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
    return config.with_overrides(**kw)


def _fmt(shape) -> str:
    return "[" + ",".join(str(int(s)) for s in shape) + "]"


def _dtype(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def validate(where: str, tensors: dict[str, torch.Tensor], meta: dict[str, str], overrides: dict | None = None,
             allow_nonfinite: bool = False) -> tuple[KDAInputs, KDAConfig]:
    """Check a dump's tensors and metadata (see the module docstring); ``where`` names the file."""
    def err(name, msg):
        return KdadbgError(f"{where}: tensor '{name}': {msg}")

    for name in REQUIRED:
        if name not in tensors:
            found = ", ".join(n for n in KNOWN if n in tensors) or "none"
            raise err(name, f"missing; a dump needs {', '.join(REQUIRED)} (found: {found})")
    for name in KNOWN:
        if name not in tensors:
            continue
        t = tensors[name]
        if name == "cu_seqlens":
            if t.dtype not in INT_DTYPES:
                raise err(name, f"expected an integer dtype (int32 or int64), found {_dtype(t.dtype)}")
        elif t.dtype not in FLOAT_DTYPES:
            raise err(name, f"expected a float dtype (bfloat16, float16, float32 or float64), "
                            f"found {_dtype(t.dtype)}")

    q = tensors["q"]
    if q.ndim != 4 or q.numel() == 0:
        raise err("q", f"expected shape [B,T,H,K] with 4 non-empty dims, found {_fmt(q.shape)}")
    B, T, H, K = q.shape
    config = parse_config(meta, K, "A_log" in tensors, where=where)
    config = apply_overrides(config, overrides, where)
    for key in ("scale", "lower_bound"):
        if not math.isfinite(getattr(config, key)):
            raise KdadbgError(f"{where}: config {key}: expected a finite number, found {getattr(config, key)}")

    v = tensors["v"]
    if v.ndim != 4 or tuple(v.shape[:3]) != (B, T, H) or v.shape[3] == 0:
        raise err("v", f"expected shape [B,T,H,V] = [{B},{T},{H},*] (B,T,H from q), found {_fmt(v.shape)}")
    V = v.shape[3]
    expect = {"k": ((B, T, H, K), "[B,T,H,K]", "from q"), "g": ((B, T, H, K), "[B,T,H,K]", "from q"),
              "do": ((B, T, H, V), "[B,T,H,V]", "B,T,H,K from q, V from v"),
              "beta": ((B, T, H), "[B,T,H]", "from q"), "A_log": ((H,), "[H]", "H from q")}
    for name, (shape, sym, src) in expect.items():
        if name in tensors and tuple(tensors[name].shape) != shape:
            raise err(name, f"expected shape {sym} = {_fmt(shape)} ({src}), found {_fmt(tensors[name].shape)}")
    if "dt_bias" in tensors and tuple(tensors["dt_bias"].shape) not in ((H, K), (H * K,)):
        raise err("dt_bias", f"expected shape [H,K] = {_fmt((H, K))} or fla's flat [H*K] = [{H * K}] (H,K from q), "
                             f"found {_fmt(tensors['dt_bias'].shape)}")

    cu = tensors.get("cu_seqlens")
    if cu is not None:
        if cu.ndim != 1 or cu.numel() < 2:
            raise err("cu_seqlens", f"expected shape [N+1] with N >= 1, found {_fmt(cu.shape)}")
        if B != 1:
            raise err("cu_seqlens", f"expected B == 1 (varlen packs the sequences in one row), found B={B} in q")
        cu = cu.to(torch.int64)
        if int(cu[0]) != 0:
            raise err("cu_seqlens", f"expected to start at 0, found {int(cu[0])}")
        step = cu[1:] - cu[:-1]
        if bool((step < 0).any()):
            i = int(torch.nonzero(step < 0)[0]) + 1
            raise err("cu_seqlens", f"expected non-decreasing offsets, found cu_seqlens[{i}]={int(cu[i])} "
                                    f"< cu_seqlens[{i - 1}]={int(cu[i - 1])}")
        if int(cu[-1]) != T:
            raise err("cu_seqlens", f"expected to end at T={T} (from q), found {int(cu[-1])}")
    N = B if cu is None else cu.numel() - 1

    state = (N, H, V, K) if config.state_layout == "vk" else (N, H, K, V)
    sym = "[N,H,V,K]" if config.state_layout == "vk" else "[N,H,K,V]"
    for name in ("h0", "dht"):
        t = tensors.get(name)
        if t is None:
            continue
        if t.ndim == 4 and t.shape[0] != N:
            seqs = "len(cu_seqlens)-1" if cu is not None else "B"
            raise err(name, f"expected one state per sequence, N={N} ({seqs}), found {t.shape[0]} "
                            f"(shape {_fmt(t.shape)})")
        if tuple(t.shape) != state:
            hint = ""
            other = (N, H, K, V) if config.state_layout == "vk" else (N, H, V, K)
            if tuple(t.shape) == other:
                hint = f"; that is the {'kv' if config.state_layout == 'vk' else 'vk'} layout, set state_layout"
            raise err(name, f"expected shape {sym} = {_fmt(state)} (state_layout={config.state_layout}), "
                            f"found {_fmt(t.shape)}{hint}")

    for name in GATE_PARAMS[config.gate]:
        if name not in tensors:
            raise err(name, f"missing; gate={config.gate} ({GATE_FORMULA[config.gate]}) needs A_log [H] and "
                            f"dt_bias [H,K] (or [H*K])")

    if not allow_nonfinite:
        for name in KNOWN:
            t = tensors.get(name)
            if t is None or not t.is_floating_point():
                continue
            bad = ~torch.isfinite(t)
            n_bad = int(bad.sum())
            if n_bad:
                n_nan = int(torch.isnan(t).sum())
                first = _fmt(torch.nonzero(bad)[0].tolist())
                raise err(name, f"expected finite values, found {n_bad} NaN/Inf ({n_nan} NaN, {n_bad - n_nan} Inf), "
                                f"first at {first} (allow_nonfinite / --allow-nonfinite loads it anyway)")

    out = {n: tensors[n] for n in KNOWN if n in tensors}
    if "cu_seqlens" in out:
        out["cu_seqlens"] = out["cu_seqlens"].to(torch.int64)
    return KDAInputs(**out), config


def _stats(t: torch.Tensor) -> dict:
    x = t.detach().to(torch.float64).flatten()
    finite = torch.isfinite(x)
    xf = x[finite]
    have = xf.numel() > 0
    return {"min": float(xf.min()) if have else None, "max": float(xf.max()) if have else None,
            "mean": float(xf.mean()) if have else None, "nan": int(torch.isnan(x).sum()),
            "inf": int(torch.isinf(x).sum())}


def describe_dump(path) -> dict:
    """What ``kdadbg inspect`` shows, as plain data; never raises for a bad dump.

    Keys: ``path``; ``ok`` and ``verdict`` ("ok" or the validation error); ``config``: a list of
    ``{key, value, default}`` (None when the metadata cannot be parsed; ``metadata`` holds the raw
    strings); ``sizes``: B, T, H, K, V, N, n_chunks (when known); ``tensors``: per tensor
    ``{name, role ('input' or 'extra'), shape, dtype, min, max, mean, nan, inf}`` (stats over the
    finite values); ``extra``: names of tensors that are not part of format v1; ``origin``: for a dump
    written by ``kdadbg.capture``, its ``capture.*`` metadata without the prefix (``step``, ``call``,
    ``module``, ``rank``, ``impl``, ...), else None.
    """
    out = {"path": str(path), "ok": False, "verdict": "", "metadata": {}, "config": None, "sizes": None,
           "tensors": [], "extra": [], "origin": None}
    try:
        tensors, meta = read_safetensors(path)
    except KdadbgError as e:
        out["verdict"] = str(e)
        return out
    out["metadata"] = meta
    origin = {k.removeprefix("capture."): v for k, v in meta.items() if k.startswith("capture.")}
    out["origin"] = origin or None
    for name, t in tensors.items():
        role = "input" if name in KNOWN else "extra"
        out["tensors"].append({"name": name, "role": role, "shape": list(t.shape), "dtype": _dtype(t.dtype),
                               **_stats(t)})
    order = {n: i for i, n in enumerate(KNOWN)}
    out["tensors"].sort(key=lambda r: (order.get(r["name"], len(order)), r["name"]))
    out["extra"] = [r["name"] for r in out["tensors"] if r["role"] == "extra"]

    config = None
    try:
        inputs, config = validate(str(path), tensors, meta)
        out["ok"], out["verdict"] = True, "ok"
        B, T, H, K, V = inputs.shape
        ct = chunk_table(B, T, inputs.cu_seqlens, config.chunk_size)
        out["sizes"] = {"B": B, "T": T, "H": H, "K": K, "V": V, "N": inputs.n_seqs, "n_chunks": ct.n_chunks}
    except KdadbgError as e:
        out["verdict"] = str(e)
        q = tensors.get("q")
        if q is not None and q.ndim == 4:
            try:
                config = parse_config(meta, q.shape[-1], "A_log" in tensors, where=str(path))
            except KdadbgError:
                config = None
    if config is not None:
        out["config"] = [{"key": k, "value": getattr(config, k), "default": k not in meta} for k in CONFIG_KEYS]
    return out
