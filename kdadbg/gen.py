"""``kdadbg gen``: write a dump from a named case of the shared case table (``kdadbg.cases``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .cases import BY_NAME, CASES, DTYPES, make_inputs, with_size
from .dump import save_dump
from .errors import KdadbgError
from .outputs import check_output

SIZE_KEYS = ("B", "T", "H", "HV", "K", "V", "dtype")
DTYPE_ALIASES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16", "fp64": "float64"}


def list_presets() -> list[dict]:
    """Every preset (case) with its sizes and note."""
    return [{"name": c.name, "note": c.note, "B": c.B, "T": c.T, "H": c.H, "HV": c.n_value_heads, "K": c.K, "V": c.V,
             "gate": c.gate, "chunk_size": c.chunk_size, "state_layout": c.state_layout,
             "cu_seqlens": list(c.cu_seqlens) if c.cu_seqlens else None, "dtype": c.dtype} for c in CASES]


def footprint(case) -> tuple[int, int]:
    """``(memory, file)`` bytes that writing ``case`` takes: its tensors are drawn in float64, cast
    to the case's dtype and copied once more for the write; the file holds them in that dtype."""
    B, T, H, HV, K, V = case.B, case.T, case.H, case.n_value_heads, case.K, case.V
    N = B if case.cu_seqlens is None else len(case.cu_seqlens) - 1
    tokens = B * T * (2 * H * K + HV * (K + 2 * V + 1))  # q, k; g, v, do, beta
    states = (int(case.h0) + int(case.dht)) * N * HV * K * V
    size = DTYPES[case.dtype].itemsize
    elements = tokens + states + HV * (K + 1)
    return elements * (8 + 2 * size) + 2 * 8 * B * T * HV * K, elements * size


def available_memory() -> int:
    """Bytes of memory available to a new allocation (``MemAvailable``: free plus reclaimable cache)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(case, out) -> None:
    """Refuse, before drawing anything, a dump that cannot fit in available memory or on the disk."""
    memory, file = footprint(case)
    free = available_memory()
    hv = f" HV={case.HV}" if case.HV is not None else ""
    sizes = f"B={case.B} T={case.T} H={case.H}{hv} K={case.K} V={case.V} {case.dtype}"
    if memory > free:
        raise KdadbgError(f"gen: {sizes} needs about {memory / 2**30:.1f} GiB of memory to generate, more than "
                          f"the {free / 2**30:.1f} GiB available; choose smaller --B/--T/--H/--K/--V")
    folder = Path(out).parent if str(Path(out).parent) else Path(".")
    disk = shutil.disk_usage(folder).free
    if file > disk:
        raise KdadbgError(f"gen: {sizes} makes a file of about {file / 2**30:.1f} GiB, more than the "
                          f"{disk / 2**30:.1f} GiB free in {folder}; choose smaller --B/--T/--H/--K/--V")


def generate(out, preset: str = "basic", seed: int = 0, force: bool = False, **sizes) -> dict:
    """Write the dump of case ``preset`` (random in ``seed``) to ``out``; ``sizes`` (B, T, H, HV, K, V,
    dtype; None = the case's) resize it. HV (value heads, GVA) must be a multiple of H; a GVA preset
    resized with H alone keeps its group size HV / H. ``out`` is checked (``kdadbg.outputs``) and the sizes are
    checked to fit in memory and on disk before anything is drawn.
    Example: ``generate("d.safetensors", "tail", T=33)``."""
    if preset not in BY_NAME:
        raise KdadbgError(f"--preset: unknown preset {preset!r}; known: {', '.join(BY_NAME)}")
    case = BY_NAME[preset]
    kw = {k: v for k, v in sizes.items() if v is not None}
    unknown = set(kw) - set(SIZE_KEYS)
    if unknown:
        raise TypeError(f"unknown size keys {sorted(unknown)}")
    if kw.get("dtype") in DTYPE_ALIASES:   # --precision's spellings (bf16, fp32) name the same dtypes
        kw["dtype"] = DTYPE_ALIASES[kw["dtype"]]
    for key, value in kw.items():
        if key == "dtype":
            if value not in DTYPES:
                raise KdadbgError(f"--dtype: expected one of {', '.join(DTYPES)} (or {', '.join(DTYPE_ALIASES)}), "
                                  f"found {value!r}")
        elif value < 1:
            raise KdadbgError(f"--{key}: expected a positive size, found {value}")
    if case.cu_seqlens is not None and ("T" in kw or kw.get("B", 1) != 1):
        raise KdadbgError(f"--preset {preset}: varlen preset with fixed cu_seqlens {list(case.cu_seqlens)}; "
                          f"--T and --B cannot change it")
    if "H" in kw and "HV" not in kw and case.HV is not None:
        kw["HV"] = kw["H"] * (case.HV // case.H)
    H = kw.get("H", case.H)
    HV = kw.get("HV", H if case.HV is None else case.HV)
    if HV % H:
        raise KdadbgError(f"--HV: expected a multiple of H={H} (value heads, each group sharing one q/k head), "
                          f"found {HV}")
    case = with_size(case, **kw)
    check_output("OUT", out, force)
    check_fits(case, out)
    inputs, config = make_inputs(case, seed=seed)
    notes = {"preset": preset, "seed": str(seed), **{f"size_{k}": str(v) for k, v in kw.items()}}
    path = save_dump(out, inputs, config, force=force, notes=notes)
    B, T, H, K, V = inputs.shape
    return {"out": str(path), "preset": preset, "seed": seed, "note": case.note,
            "sizes": {"B": B, "T": T, "H": H, "HV": inputs.HV, "K": K, "V": V, "N": inputs.n_seqs}, "dtype": case.dtype,
            "config": config.as_dict(), "bytes": path.stat().st_size}
