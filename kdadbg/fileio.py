"""Safetensors I/O: every file kdadbg writes goes through ``atomic_save``, every read through
``read_safetensors``.

A write lands in a temporary file in the destination folder and is then moved into place, so a
crash or a refused overwrite never leaves a half-written or clobbered file behind.
"""

from __future__ import annotations

import os
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .errors import KdadbgError


def _atomic_write(path, force: bool, write) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then move it into place:
    never over an existing file unless ``force``; no temporary file is left behind."""
    path = Path(path)
    if path.is_dir():
        raise KdadbgError(f"{path}: is a folder, expected a file path to write")
    if path.exists() and not force:
        raise KdadbgError(f"{path}: already exists; refusing to overwrite (use --force)")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise KdadbgError(f"{path}: folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
        if force:
            os.replace(tmp, path)
        else:
            _link_no_clobber(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_save(tensors: dict[str, torch.Tensor], metadata: dict[str, str], path, force: bool = False) -> Path:
    """Write ``tensors`` and string ``metadata`` to the safetensors file ``path``.

    Refuses to replace an existing file unless ``force``. Example:
    ``atomic_save({"x": torch.zeros(3)}, {"note": "hi"}, "out.safetensors")``.
    """
    bad = [k for k, v in metadata.items() if not isinstance(v, str)]
    if bad:
        raise TypeError(f"metadata values must be strings: {bad}")
    cpu = {k: t.detach().to("cpu").contiguous().clone() for k, t in tensors.items()}
    return _atomic_write(path, force, lambda tmp: save_file(cpu, tmp, metadata=dict(metadata)))


def atomic_write_text(text: str, path, force: bool = False) -> Path:
    """Write a text file (JSON reports) with the same no-clobber, temp-then-move rule."""
    return _atomic_write(path, force, lambda tmp: Path(tmp).write_text(text))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _link_no_clobber(tmp: str, path: Path) -> None:
    """Move ``tmp`` to ``path`` atomically, failing if ``path`` appeared in the meantime."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise KdadbgError(f"{path}: already exists; refusing to overwrite (use --force)") from None
    except OSError:  # a filesystem without hard links
        if path.exists():
            raise KdadbgError(f"{path}: already exists; refusing to overwrite (use --force)") from None
        os.replace(tmp, path)


def read_safetensors(path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor and the ``__metadata__`` of a safetensors file, or a one-line ``KdadbgError``."""
    p = Path(path)
    if not p.exists():
        raise KdadbgError(f"{path}: file not found")
    if p.is_dir():
        raise KdadbgError(f"{path}: is a folder, expected a safetensors file")
    try:
        with safe_open(str(p), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise KdadbgError(f"{path}: not a readable safetensors file ({reason})") from None
    return tensors, meta


def kdadbg_version() -> str:
    try:
        return version("kdadbg")
    except PackageNotFoundError:
        return "unknown"
