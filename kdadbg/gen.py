"""``kdadbg gen``: write a dump from a named case of the shared case table (``kdadbg.cases``)."""

from __future__ import annotations

from .cases import BY_NAME, CASES, DTYPES, make_inputs, with_size
from .dump import save_dump
from .errors import KdadbgError

SIZE_KEYS = ("B", "T", "H", "K", "V", "dtype")


def list_presets() -> list[dict]:
    """Every preset (case) with its sizes and note."""
    return [{"name": c.name, "note": c.note, "B": c.B, "T": c.T, "H": c.H, "K": c.K, "V": c.V,
             "gate": c.gate, "chunk_size": c.chunk_size, "state_layout": c.state_layout,
             "cu_seqlens": list(c.cu_seqlens) if c.cu_seqlens else None, "dtype": c.dtype} for c in CASES]


def generate(out, preset: str = "basic", seed: int = 0, force: bool = False, **sizes) -> dict:
    """Write the dump of case ``preset`` (random in ``seed``) to ``out``; ``sizes`` (B, T, H, K, V,
    dtype; None = the case's) resize it. Example: ``generate("d.safetensors", "tail", T=33)``."""
    if preset not in BY_NAME:
        raise KdadbgError(f"--preset: unknown preset {preset!r}; known: {', '.join(BY_NAME)}")
    case = BY_NAME[preset]
    kw = {k: v for k, v in sizes.items() if v is not None}
    unknown = set(kw) - set(SIZE_KEYS)
    if unknown:
        raise TypeError(f"unknown size keys {sorted(unknown)}")
    for key, value in kw.items():
        if key == "dtype":
            if value not in DTYPES:
                raise KdadbgError(f"--dtype: expected one of {', '.join(DTYPES)}, found {value!r}")
        elif value < 1:
            raise KdadbgError(f"--{key}: expected a positive size, found {value}")
    if case.cu_seqlens is not None and ("T" in kw or kw.get("B", 1) != 1):
        raise KdadbgError(f"--preset {preset}: varlen preset with fixed cu_seqlens {list(case.cu_seqlens)}; "
                          f"--T and --B cannot change it")
    case = with_size(case, **kw)
    inputs, config = make_inputs(case, seed=seed)
    notes = {"preset": preset, "seed": str(seed), **{f"size_{k}": str(v) for k, v in kw.items()}}
    path = save_dump(out, inputs, config, force=force, notes=notes)
    B, T, H, K, V = inputs.shape
    return {"out": str(path), "preset": preset, "seed": seed, "note": case.note,
            "sizes": {"B": B, "T": T, "H": H, "K": K, "V": V, "N": inputs.n_seqs}, "dtype": case.dtype,
            "config": config.as_dict(), "bytes": path.stat().st_size}
