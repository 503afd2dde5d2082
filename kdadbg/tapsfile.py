"""The taps file: outputs, gradients, selected taps and the chunk table of one run, as safetensors.

Layout (v1; other implementations may write it too)::

    o, ht, dq, dk, dv, dg, dbeta      always (not with taps --no-outputs); whole, dump shapes, ht in the
                                      dump's state layout
    dh0                               when the dump has h0 (dump's state layout)
    dA_log, ddt_bias                  for the lower_bound and softplus gates
    tap.<name>                        [n_chunks_sel, n_heads_sel, *per-chunk shape]; padding rows 0
    chunk.index chunk.seq chunk.start chunk.len     int64 [n_chunks_sel]
    head.index                                      int64 [n_heads_sel]

Metadata: ``format`` (``kdadbg-taps-v1``), ``source`` (the implementation's name), ``dump`` (file name),
the config keys of the dump format, ``kdadbg_version`` and ``precision`` (what the values were computed at:
``fp32``/``bf16`` dot operands, ``float64`` for the reference; absent in older reference files).
"""

from __future__ import annotations

from pathlib import Path

import torch

from kdadbg_kernels.taps import GRADIENTS, OUTPUTS, REGISTRY, TAP_NAMES

from .chunks import ChunkTable
from .config import KDAConfig, KDAInputs
from .errors import KdadbgError
from .fileio import TensorSpec, atomic_save, kdadbg_version, read_safetensors

FORMAT = "kdadbg-taps-v1"
OUTPUT_NAMES = OUTPUTS + GRADIENTS
CHUNK_KEYS = ("chunk.index", "chunk.seq", "chunk.start", "chunk.len")
HEAD_KEY = "head.index"
TAP_PREFIX = "tap."


def _fmt(shape) -> str:
    return "[" + ",".join(str(int(s)) for s in shape) + "]"


def outputs_that_apply(inputs: KDAInputs, config: KDAConfig) -> tuple[str, ...]:
    """Names of the whole-tensor outputs a run on this dump produces."""
    names = ["o", "ht", "dq", "dk", "dv", "dg", "dbeta"]
    if inputs.h0 is not None:
        names.append("dh0")
    if config.gate != "none":
        names += ["dA_log", "ddt_bias"]
    return tuple(names)


def zero_padding(name: str, tensor: torch.Tensor, lengths) -> torch.Tensor:
    """Tap ``name`` of shape ``[n_chunks, n_heads, *per-chunk shape]`` with every padding row set to 0.

    ``lengths[i]`` is the number of valid rows of chunk row ``i``; rows ``>= lengths[i]`` on every
    axis indexed by a chunk row (rows and columns of ``[C,C]`` taps) become 0, NaN included.
    Example: ``zero_padding("L", taps["L"], chunks.length)``.
    """
    tap = REGISTRY[name]
    if tensor.ndim != 2 + len(tap.shape):
        raise KdadbgError(f"tap '{name}': expected {2 + len(tap.shape)} dims [chunks,heads,"
                          f"{','.join(tap.shape)}], found shape {_fmt(tensor.shape)}")
    lengths = torch.as_tensor(lengths, dtype=torch.long, device=tensor.device)
    if lengths.shape != (tensor.shape[0],):
        raise KdadbgError(f"tap '{name}': expected {tensor.shape[0]} chunk lengths, found {_fmt(lengths.shape)}")
    out = tensor
    for axis in tap.row_dims:
        dim = 2 + axis
        rows = torch.arange(tensor.shape[dim], device=tensor.device)
        shape = [1] * tensor.ndim
        shape[0], shape[dim] = tensor.shape[0], tensor.shape[dim]
        valid = (rows[None, :] < lengths[:, None]).reshape(shape)
        out = torch.where(valid, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out


def chunk_rows(chunks: ChunkTable, lo: int, hi: int) -> dict[str, torch.Tensor]:
    """The ``chunk.*`` tensors for global chunks ``lo..hi-1``."""
    return {"chunk.index": torch.arange(lo, hi, dtype=torch.int64),
            "chunk.seq": chunks.seq[lo:hi].to(torch.int64),
            "chunk.start": chunks.export_start[lo:hi].to(torch.int64),
            "chunk.len": chunks.length[lo:hi].to(torch.int64)}


def inputs_fingerprint(inputs) -> str:
    """A digest of a dump's inputs (every tensor of ``KDAInputs.TENSORS`` present: its name, shape and
    values, floats as float64 and integers as int64, so that a float32 copy of a bf16 dump, the same
    problem, has the same digest), written into what is made from them (``inputs_sha256``), so that a taps
    or outputs file compared against another dump is refused instead of reported as a bug in every cell."""
    import hashlib

    h = hashlib.sha256()
    for name in inputs.TENSORS:
        t = getattr(inputs, name)
        if t is None:
            continue
        t = t.detach().to("cpu").reshape(-1)
        wide = torch.float64 if t.is_floating_point() else torch.int64
        h.update(f"{name}:{list(getattr(inputs, name).shape)};".encode())
        step = 1 << 22   # slices, so that a large dump is not copied whole in 8 bytes per value
        for i in range(0, t.numel(), step):
            h.update(t[i:i + step].to(wide).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


CONFIG_KEYS = ("scale", "gate", "lower_bound", "qk_l2norm", "beta_sigmoid")   # the math (chunk_size: its own check)


def config_differences(meta: dict, config_meta: dict, keys: tuple[str, ...] = CONFIG_KEYS) -> list[str]:
    """The config keys (``CONFIG_KEYS``, or ``keys``) whose values differ between a file's metadata and a dump's
    config (``KDAConfig.to_metadata()``, or another file's metadata), as ``key file-value / other-value``; keys
    absent on either side are not compared, nor ``lower_bound`` unless the gate is ``lower_bound``."""
    return [f"{key} {a} / {b}" for key, a, b in _differing(meta, config_meta, keys)]


def config_overrides(meta: dict, config_meta: dict, keys: tuple[str, ...] = CONFIG_KEYS) -> str:
    """The config overrides (``--gate softplus --chunk-size 32``) that give a dump the config of a file's
    metadata, every differing key at once (``config_differences``)."""
    opts = []
    for key, a, _ in _differing(meta, config_meta, keys):
        flag = "--" + key.replace("_", "-")
        if key in ("qk_l2norm", "beta_sigmoid"):
            opts.append(flag if str(a).strip().lower() in ("true", "1", "yes", "on") else "--no-" + flag[2:])
        else:
            opts.append(f"{flag} {str(a).strip()}")
    return " ".join(opts)


def _differing(meta: dict, config_meta: dict, keys: tuple[str, ...]) -> list[tuple[str, object, object]]:
    out = []
    for key in keys:
        a, b = meta.get(key), config_meta.get(key)
        if a is None or b is None:
            continue
        if key == "lower_bound" and config_meta.get("gate") != "lower_bound":
            continue
        try:
            same = float(a) == float(b) if key in ("scale", "lower_bound") else str(a).strip() == str(b).strip()
        except ValueError:
            same = str(a).strip() == str(b).strip()
        if not same:
            out.append((key, a, b))
    return out


def taps_metadata(source: str, dump, config: KDAConfig, precision: str | None = None, inputs=None) -> dict[str, str]:
    """A taps file's metadata; with ``inputs`` also their digest (``inputs_sha256``, :func:`inputs_fingerprint`)."""
    meta = {"format": FORMAT, "source": source, "dump": Path(dump).name, "kdadbg_version": kdadbg_version(),
            **config.to_metadata()}
    if precision is not None:
        meta["precision"] = precision
    if inputs is not None:
        meta["inputs_sha256"] = inputs_fingerprint(inputs)
    return meta


def write_taps_file(path, outputs: dict[str, torch.Tensor], taps: dict[str, torch.Tensor],
                    chunks: dict[str, torch.Tensor], heads, metadata: dict[str, str], force: bool = False) -> Path:
    """Write a taps file. ``taps`` are already selected (``[n_chunks_sel, n_heads_sel, ...]``); their
    padding rows are zeroed here with ``chunks["chunk.len"]``. ``heads`` is the selected head list."""
    unknown = [n for n in outputs if n not in OUTPUT_NAMES] + [n for n in taps if n not in REGISTRY]
    if unknown:
        raise ValueError(f"not part of the taps file layout: {unknown}")
    tensors = {name: outputs[name] for name in OUTPUT_NAMES if name in outputs}
    for name in TAP_NAMES:
        if name in taps:
            tensors[TAP_PREFIX + name] = zero_padding(name, taps[name], chunks["chunk.len"])
    for key in CHUNK_KEYS:
        tensors[key] = chunks[key].to(torch.int64)
    tensors[HEAD_KEY] = torch.as_tensor(list(heads), dtype=torch.int64)
    return atomic_save(tensors, metadata, path, force=force)


def taps_file_kind(meta: dict[str, str], names) -> str | None:
    """Who wrote a safetensors file of the taps file layout, from its metadata and tensor ``names`` (its
    header alone): ``"capture"`` (a capture's ``NAME.theirs.safetensors``), ``"taps"`` (``kdadbg taps`` or
    another writer of the layout: metadata ``format`` is ``FORMAT``), ``"run --save"`` (no ``format``, a
    ``source``, and only outputs and gradients); None for anything else (a dump, say)."""
    names = list(names)
    if meta.get("format") == FORMAT:
        return "capture" if meta.get("source") == "capture" else "taps"
    if "format" not in meta and "source" in meta and names and all(n in OUTPUT_NAMES for n in names):
        return "run --save"
    return None


def written_by(kind: str, meta: dict[str, str]) -> str:
    """How a taps file of ``kind`` (:func:`taps_file_kind`) came to be, in words."""
    return {"capture": f"written by `kdadbg capture` beside {meta.get('dump') or 'its dump'}",
            "taps": "made by `kdadbg taps`, or another writer of the layout",
            "run --save": "made by `kdadbg run --save`"}[kind]


def _float(spec) -> bool:
    return isinstance(spec.dtype, torch.dtype) and spec.dtype.is_floating_point


def _integer(spec) -> bool:
    dt = spec.dtype
    return isinstance(dt, torch.dtype) and not (dt.is_floating_point or dt.is_complex or dt == torch.bool)


def check_taps_layout(path, specs: dict, meta: dict[str, str], index: dict[str, torch.Tensor],
                      state_layout: str = "kv") -> dict:
    """Everything a taps file's header decides (``specs``: name -> ``TensorSpec``), with the small index
    tensors ``index`` (``chunk.*``, ``head.index``, those present) read: float outputs and taps, a whole chunk
    table where there are taps, tap shapes against it and each other, chunk lengths within the chunk size.
    Returns ``{"chunks": {"index", "seq", "start", "len"} or {}, "heads": tensor or None, "outputs": [names],
    "taps": [names], "missing_taps", "unknown"}``; a problem is one ``KdadbgError`` naming the file."""
    def err(msg):
        return KdadbgError(f"{path}: {msg}")

    outputs = [n for n in OUTPUT_NAMES if n in specs]
    taps = [n for n in TAP_NAMES if TAP_PREFIX + n in specs]
    known = set(OUTPUT_NAMES) | {TAP_PREFIX + n for n in TAP_NAMES} | set(CHUNK_KEYS) | {HEAD_KEY}
    unknown = sorted(k for k in specs if k not in known)
    for name in [*outputs, *(TAP_PREFIX + n for n in taps)]:
        if not _float(specs[name]):
            raise err(f"tensor '{name}': expected a float dtype, found {str(specs[name].dtype).removeprefix('torch.')}")

    chunks, heads = {}, None
    present = [k for k in (*CHUNK_KEYS, HEAD_KEY) if k in specs]
    if taps or present:
        for key in (*CHUNK_KEYS, HEAD_KEY):
            if key not in specs:
                raise err(f"tensor '{key}': missing; a taps file with taps needs {', '.join(CHUNK_KEYS)}, {HEAD_KEY}")
            t = specs[key]
            if t.ndim != 1 or not _integer(t):
                raise err(f"tensor '{key}': expected a 1-D integer tensor, found {str(t.dtype).removeprefix('torch.')} "
                          f"{_fmt(t.shape)}")
        chunks = {k.removeprefix("chunk."): index[k].to(torch.int64) for k in CHUNK_KEYS}
        heads = index[HEAD_KEY].to(torch.int64)
        n = chunks["index"].numel()
        for k, t in chunks.items():
            if t.numel() != n:
                raise err(f"tensor 'chunk.{k}': expected {n} entries (like chunk.index), found {t.numel()}")

    sizes: dict[str, int] = {}
    if "chunk_size" in meta:
        try:
            sizes["C"] = int(meta["chunk_size"])
        except ValueError:
            raise err(f"metadata chunk_size: expected an integer, found {meta['chunk_size']!r}") from None
    for name in taps:
        t = specs[TAP_PREFIX + name]
        shape = REGISTRY[name].shape
        if state_layout == "vk" and shape == ("K", "V"):
            shape = ("V", "K")
        want_nd = 2 + len(shape)
        if t.ndim != want_nd or t.shape[0] != chunks["index"].numel() or t.shape[1] != heads.numel():
            raise err(f"tensor 'tap.{name}': expected shape [{chunks['index'].numel()},{heads.numel()},"
                      f"{','.join(shape)}] (chunk rows, heads, per-chunk), found {_fmt(t.shape)}")
        for sym, size in zip(shape, t.shape[2:]):
            if sizes.setdefault(sym, int(size)) != size:
                hint = ""
                found = tuple(int(x) for x in t.shape[2:])
                # the other layout's shape: its last dim this layout's first (known), its first the other (or not
                # yet known: V's first tap may come later)
                if len(shape) == 2 and set(shape) == {"K", "V"} and found[1] == sizes.get(shape[0]) and \
                        sizes.get(shape[1], found[0]) == found[0]:
                    other = "vk" if state_layout != "vk" else "kv"   # its shape is the other layout's, exactly
                    hint = (f": the [{','.join(shape[::-1])}] of a {other} state layout "
                            f"(--taps-state-layout {other}, or TapsSpec(state_layout={other!r}) for a function)")
                raise err(f"tensor 'tap.{name}': expected per-chunk shape [{','.join(shape)}] with "
                          f"{sym}={sizes[sym]}, found {_fmt(t.shape[2:])}{hint}")
    if chunks and "C" in sizes and bool(((chunks["len"] < 1) | (chunks["len"] > sizes["C"])).any()):
        raise err(f"tensor 'chunk.len': expected values in 1..{sizes['C']}, found {chunks['len'].tolist()}")
    return {"chunks": chunks, "heads": heads, "outputs": outputs, "taps": taps,
            "missing_taps": [n for n in TAP_NAMES if n not in taps], "unknown": unknown}


def read_taps_file(path, state_layout: str = "kv") -> dict:
    """A taps file as plain data, checked for consistency (:func:`check_taps_layout`).

    ``state_layout="vk"``: the file's ``S``/``dS`` taps are ``[V, K]`` (another implementation's
    layout; ``kdadbg diff --state-layout vk`` transposes them), checked as such.

    Returns ``{"path", "metadata", "outputs": {name: tensor}, "taps": {name: tensor},
    "chunks": {"index", "seq", "start", "len"} (int64), "heads": int64 tensor,
    "missing_taps": [registry taps not in the file], "unknown": [keys outside the layout]}``.
    Missing taps are fine; a malformed chunk table or tap shape raises ``KdadbgError``.
    """
    tensors, meta = read_safetensors(path)
    layout = check_taps_layout(path, {n: TensorSpec.of(t) for n, t in tensors.items()}, meta, tensors, state_layout)
    return {"path": str(path), "metadata": meta, "outputs": {n: tensors[n] for n in layout["outputs"]},
            "taps": {n: tensors[TAP_PREFIX + n] for n in layout["taps"]}, "chunks": layout["chunks"],
            "heads": layout["heads"], "missing_taps": layout["missing_taps"], "unknown": layout["unknown"]}
