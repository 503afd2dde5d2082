"""The Triton interpreter without its repeated patching: the same functions, the same bits, less time.

Triton's interpreter (3.x) swaps ``triton.language``'s builtins for NumPy ones when a launch starts
(``GridExecutor``) and puts them back when it ends. It also repeats the swap on *every* call of a
``@triton.jit`` device function inside the launch (``InterpretedFunction.__call__``), scanning
``tl``, ``tl.tensor`` and ``tl.math`` with ``inspect.getmembers`` each time; the builtins are already
swapped by then, so the scan finds nothing new. Our kernels call small device functions in their inner
loops (``_pair``, ``mm_tf32``, ...), and that scan was a third of their time under the interpreter
(cProfile, a T=256, H=16, K=V=128, chunk-64 window: 64 of 202 s).

:func:`skip_repeated_patching` makes a device function's call skip the swap when the enclosing launch
has already made it for every ``triton.language`` module the function can see (otherwise it swaps, as
before). It changes no computation: :func:`kdadbg.impls.ours.run_kernels` gives the same bits with and
without it (``tests/test_window.py``).
"""

from __future__ import annotations

import threading

_state = threading.local()   # in_launch: inside GridExecutor.__call__; langs: the module ids it swapped
_installed = False


def _langs(fn) -> frozenset[int]:
    """Ids of the ``triton.language`` modules in ``fn``'s globals, the ones ``_patch_lang`` patches."""
    import inspect

    import triton.language as tl

    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


def skip_repeated_patching() -> bool:
    """Install the skip (idempotent); False when this Triton's interpreter is not the one it knows."""
    global _installed
    if _installed:
        return True
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    original = getattr(interp, "_patch_lang", None)
    scope_cls = getattr(interp, "_LangPatchScope", None)
    launch = getattr(getattr(interp, "GridExecutor", None), "__call__", None)
    if original is None or scope_cls is None or launch is None:
        return False
    seen: dict = {}

    def patch_lang(fn):
        langs = seen.get(fn)
        if langs is None:
            langs = seen[fn] = _langs(fn)
        swapped = getattr(_state, "langs", None)
        if swapped is not None and langs <= swapped:
            return scope_cls()           # the enclosing launch has swapped them already
        scope = original(fn)
        if getattr(_state, "in_launch", False):
            _state.langs = langs if swapped is None else swapped | langs
        return scope

    def run_launch(self, *args, **kwargs):
        _state.in_launch, _state.langs = True, None
        try:
            return launch(self, *args, **kwargs)
        finally:
            _state.in_launch, _state.langs = False, None

    patch_lang.original, run_launch.original = original, launch
    interp._patch_lang = patch_lang
    interp.GridExecutor.__call__ = run_launch
    _installed = True
    return True
