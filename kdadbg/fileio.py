"""Safetensors I/O: every file kdadbg writes goes through ``atomic_save``, every read through
``read_safetensors``.

A write lands in a temporary file in the destination folder and is then moved into place, so a
crash or a refused overwrite never leaves a half-written or clobbered file behind.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .errors import KdadbgError, OutputExists


def _atomic_write(path, force: bool, write, fmt: str | None = None) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then move it into place:
    never over an existing file unless ``force``; a symbolic link is replaced, never written
    through; no temporary file is left behind; an OS error is one ``KdadbgError`` line."""
    from .outputs import check_output

    path = check_output("", path, force, fmt)
    folder = path.parent if str(path.parent) else Path(".")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
        os.close(fd)
        write(tmp)
        keep = path.exists() and not path.is_symlink()
        os.chmod(tmp, path.stat().st_mode & 0o777 if keep else 0o666 & ~_umask())
        if force:
            os.replace(tmp, path)
        else:
            _link_no_clobber(tmp, path)
    except OSError as e:
        raise KdadbgError(f"{path}: cannot write ({e.strerror or e})") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
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
    return _atomic_write(path, force, lambda tmp: save_file(cpu, tmp, metadata=dict(metadata)), "safetensors")


def atomic_write_text(text: str, path, force: bool = False) -> Path:
    """Write a text file (JSON reports) with the same no-clobber, temp-then-move rule."""
    return _atomic_write(path, force, lambda tmp: Path(tmp).write_text(text))


def atomic_write_bytes(data: bytes, path, force: bool = False) -> Path:
    """Write a binary file (PNG plots) with the same no-clobber, temp-then-move rule."""
    return _atomic_write(path, force, lambda tmp: Path(tmp).write_bytes(data))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _link_no_clobber(tmp: str, path: Path) -> None:
    """Move ``tmp`` to ``path`` atomically, failing if ``path`` appeared in the meantime."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise OutputExists(f"{path}: already exists; refusing to overwrite (use --force)") from None
    except OSError:  # a filesystem without hard links
        if path.exists():
            raise OutputExists(f"{path}: already exists; refusing to overwrite (use --force)") from None
        os.replace(tmp, path)


# safetensors dtype codes; a code missing here is reported by name
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool, "C64": torch.complex64,
}
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as a file's header describes it: shape and dtype (a ``torch.dtype``, or the file's
    code when torch has none)."""

    shape: tuple[int, ...]
    dtype: torch.dtype | str

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    @staticmethod
    def of(t: torch.Tensor) -> "TensorSpec":
        return TensorSpec(tuple(t.shape), t.dtype)


def _unreadable(path, reason: str) -> KdadbgError:
    return KdadbgError(f"{path}: not a readable safetensors file ({reason})")


def read_header(path) -> tuple[dict[str, TensorSpec], dict[str, str]]:
    """Shapes and dtypes of a safetensors file's tensors and its ``__metadata__``, without reading
    any tensor data; a file that is missing, not safetensors or truncated is one ``KdadbgError``."""
    p = Path(path)
    if not p.exists():
        raise KdadbgError(f"{path}: file not found")
    if p.is_dir():
        raise KdadbgError(f"{path}: is a folder, expected a safetensors file")
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _unreadable(path, f"header too small: {size} bytes")
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER_BYTES:
                text = head.decode("ascii", "replace")
                looks = (f"; it starts with text, {text!r}, as a JSON, CSV or other text file does"
                         if text.isprintable() or text.strip().isprintable() else
                         "; it starts as a zip or pickle (torch.save) file does" if head[:2] in (b"PK", b"\x80\x02")
                         else "")
                raise _unreadable(path, f"its first 8 bytes, a header length, say {n} bytes, not plausible{looks}")
            if 8 + n > size:
                raise KdadbgError(f"{path}: truncated: its header needs {8 + n} bytes, the file holds {size}")
            raw = f.read(n)
    except OSError as e:
        raise _unreadable(path, e.strerror or type(e).__name__) from None
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
        meta = header.pop("__metadata__", None) or {}
        specs, end = {}, 0
        for name, entry in header.items():
            code = entry["dtype"]
            specs[name] = TensorSpec(tuple(int(d) for d in entry["shape"]), SAFETENSORS_DTYPES.get(code, code))
            end = max(end, int(entry["data_offsets"][1]))
        meta = {str(k): str(v) for k, v in dict(meta).items()}
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise _unreadable(path, f"malformed header: {e}") from None
    if 8 + n + end > size:
        raise KdadbgError(f"{path}: truncated: its header describes {8 + n + end} bytes, the file holds {size}")
    return specs, meta


def read_tensors(path, names=None) -> dict[str, torch.Tensor]:
    """The tensors ``names`` (default all) of a safetensors file whose header ``read_header`` accepted."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: f.get_tensor(name) for name in (f.keys() if names is None else names)}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _unreadable(path, reason) from None


def read_safetensors(path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor and the ``__metadata__`` of a safetensors file, or a one-line ``KdadbgError``."""
    _, meta = read_header(path)
    return read_tensors(path), meta


def kdadbg_version() -> str:
    try:
        return version("kdadbg")
    except PackageNotFoundError:
        return "unknown"
