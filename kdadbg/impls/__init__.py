"""Implementations under test and their registry (``--impl NAME``).

=====================  =========================================================================
NAME                   what runs
=====================  =========================================================================
``ours`` (default)     our Triton kernels at ``--precision`` (:mod:`.ours`)
``reference``          the float64 reference itself: a self-check that must pass exactly
``flashkda``           MoonshotAI's FlashKDA CUDA kernels, taps from its own buffers (:mod:`.flashkda`)
``fla``                fla-core 0.6.0's ``chunk_kda`` (Triton path) with its intermediates as taps (:mod:`.fla`)
``PATH.py:FUNCTION``   a function in a file, fla's ``chunk_kda`` convention (:mod:`.function`)
``MODULE:FUNCTION``    an importable one, e.g. ``fla.ops.kda:chunk_kda``, ``kdadbg_kernels:chunk_kda``
a taps file            another implementation's results (``diff --against FILE``; :mod:`.tapsfile`)
=====================  =========================================================================

Adapters register further names with :func:`register` (a factory taking ``precision``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..errors import KdadbgError
from .base import Implementation, ImplError, ImplRun, TapsSpec, check_supported, convert_taps, shapes_of

REGISTRY: dict[str, Callable[[str], Implementation]] = {}


def register(name: str, factory: Callable[[str], Implementation]) -> None:
    REGISTRY[name] = factory


def _ours(precision: str) -> Implementation:
    from .ours import Ours
    return Ours(precision)


def _reference(precision: str) -> Implementation:
    from .reference import Reference
    return Reference(precision)


def _flashkda(precision: str) -> Implementation:
    from .flashkda import FlashKDA
    return FlashKDA(precision)


def _fla(precision: str) -> Implementation:
    from .fla import Fla   # imports nothing of fla until it runs
    return Fla(precision)


register("ours", _ours)
register("reference", _reference)
register("flashkda", _flashkda)
register("fla", _fla)


def names_a_taps_file(spec: str | None) -> bool:
    """Whether ``--impl spec`` is read as a taps file (:func:`resolve_impl`'s rule): an existing file that
    is neither a registered name nor a ``.py``."""
    spec = (spec or "").strip()
    return bool(spec) and spec not in (*REGISTRY, "kernel", "kernels") and not spec.endswith(".py") \
        and Path(spec).is_file()


def resolve_impl(spec: str | None, precision: str = "fp32", taps_spec: TapsSpec | None = None) -> Implementation:
    """The implementation ``spec`` names (None: ours). A path to a taps file is one too."""
    from .function import Function, load_callable
    from .tapsfile import TapsFile

    spec = "ours" if spec is None else str(spec).strip()
    if spec in ("kernel", "kernels"):
        spec = "ours"
    if spec in REGISTRY:
        return REGISTRY[spec](precision)
    if ":" in spec and not Path(spec).is_file():
        obj = load_callable(spec)
        if isinstance(obj, Implementation):
            return obj
        return Function(obj, spec, precision)
    if Path(spec).is_file():
        if spec.endswith(".py"):   # a Python file read as a taps file said "not a readable safetensors file"
            raise KdadbgError(f"--impl {spec}: a Python file needs the function to call after a colon, "
                              f"PATH.py:FUNCTION (e.g. {spec}:chunk_kda)")
        return TapsFile(spec, taps_spec or TapsSpec(), precision)
    known = ", ".join(REGISTRY)
    raise KdadbgError(f"--impl {spec}: expected one of {known}, PATH.py:FUNCTION, MODULE:FUNCTION or a taps file; "
                      f"found no such name or file")


def as_implementation(impl, precision: str = "fp32") -> Implementation:
    """What the Python API's ``impl=`` takes: an :class:`Implementation`, a name or path as ``--impl`` takes it
    (``"ours"``, ``"fla"``, ``"path.py:fn"``, a taps file), or a function in fla's ``chunk_kda`` convention;
    None: ours at ``precision``. One line (``KdadbgError``) for anything else."""
    from .function import Function

    if impl is None:
        return resolve_impl("ours", precision)
    if isinstance(impl, Implementation):
        return impl
    if isinstance(impl, (str, Path)):
        return resolve_impl(str(impl), precision)
    if callable(impl):
        name = f"{getattr(impl, '__module__', '?')}:{getattr(impl, '__qualname__', repr(impl))}"
        return Function(impl, name, precision)
    raise KdadbgError(f"impl: expected an Implementation, a name or PATH.py:FUNCTION as --impl takes, or a "
                      f"function in chunk_kda's convention; found {type(impl).__name__}")


__all__ = ["Implementation", "as_implementation", "ImplError", "ImplRun", "TapsSpec", "check_supported", "convert_taps", "register",
           "names_a_taps_file", "resolve_impl", "shapes_of", "REGISTRY"]
