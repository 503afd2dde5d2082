"""Replacing a function wherever it is loaded, and as its module is imported (for ``kdadbg.capture``).

A target is ``"fla"`` (fla's ``chunk_kda``), ``"kdadbg"`` (ours), ``"pkg.mod:fn"`` (a module-level
function) or a callable. :class:`Patches` sets every attribute of every loaded module whose value
*is* the function object to a wrapper; for a module not imported yet, an import hook does the same
right after the module has run, before anyone can import the name from it. ``restore`` undoes all;
``unresolved`` says, before that, which named targets were never patched and why.
"""

from __future__ import annotations

import difflib
import importlib.abc
import importlib.util
import sys
from typing import Callable, Iterable

from .errors import KdadbgError

ALIASES = {"fla": "fla.ops.kda.chunk:chunk_kda", "kdadbg": "kdadbg_kernels.chunk:chunk_kda"}
DEFAULT_TARGETS = ("fla", "kdadbg")


def parse_target(target: str) -> tuple[str, str]:
    """``"fla"``, ``"kdadbg"`` or ``"pkg.mod:fn"`` -> (module name, function name)."""
    mod, sep, attr = ALIASES.get(target, target).partition(":") if isinstance(target, str) else ("", "", "")
    if not sep or not mod or not attr.isidentifier():
        raise KdadbgError(f"capture target {target!r}: expected 'package.module:function' (a module-level "
                          f"function), 'fla', 'kdadbg' or a callable")
    return mod, attr


def no_function(module, mod: str, attr: str) -> str | None:
    """Why ``module`` (named ``mod``) has nothing to patch as ``attr``, with the nearest function names; None
    when it has that function."""
    if callable(getattr(module, attr, None)):
        return None
    names = {*dir(module), *getattr(module, "__all__", ())}   # a lazy module (__getattr__) lists its own in these
    near = difflib.get_close_matches(attr, sorted(n for n in names if not n.startswith("_")), n=2, cutoff=0.75)
    hint = f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""
    return f"module {mod} has no function {attr!r}{hint}"


def missing_loaded(targets) -> list[tuple[str, str]]:
    """The targets given by name whose module is loaded in this process but has no such function:
    ``[(target as given, why)]``. What ``kdadbg capture`` checks before it runs a command (the command's
    processes load the same modules before their first line: a session there would fail at interpreter
    start). A module not loaded here is judged where the command imports it."""
    out = []
    for target in targets:
        if callable(target):
            continue
        mod, attr = parse_target(target)
        module = sys.modules.get(mod)
        why = no_function(module, mod, attr) if module is not None else None
        if why:
            out.append((target, why))
    return out


def _replace_everywhere(old, new) -> int:
    """Set every attribute of every loaded module whose value *is* ``old`` to ``new``; returns how many."""
    n = 0
    for module in list(sys.modules.values()):
        try:
            items = list(vars(module).items())
        except TypeError:
            continue
        for key, value in items:
            if value is old:
                try:
                    setattr(module, key, new)
                    n += 1
                except (AttributeError, TypeError):
                    pass
    return n


class _PatchingLoader(importlib.abc.Loader):
    """A module's own loader, then a callback once the module has run (to patch what it defines)."""

    def __init__(self, inner, loaded):
        self._inner, self._loaded = inner, loaded

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._loaded(module)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _ImportHook(importlib.abc.MetaPathFinder):
    """Hands the named modules to ``loaded`` right after they are imported."""

    def __init__(self, names: Iterable[str], loaded):
        self.names, self._loaded = set(names), loaded

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader, self._loaded)
        return spec


class Patches:
    """The targets, replaced by wrappers where they are loaded and as their modules are imported."""

    def __init__(self, wrap, warn):
        self._wrap, self._warn = wrap, warn
        self.wrapped: dict[int, tuple[Callable, Callable]] = {}
        self.pending: dict[str, list[str]] = {}
        self.hook: _ImportHook | None = None
        self.named: dict[str, tuple[str, str]] = {}   # each target given by name -> (module, function)
        self.patched: set[str] = set()                # the "module:function" pairs patched
        self.failed: dict[str, str] = {}              # "module:function" -> why its module had none to patch

    def add(self, target) -> None:
        if callable(target):
            impl = f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"
            if self._patch(target, impl) == 0:
                raise KdadbgError(f"capture target {impl}: not found as an attribute of any loaded module "
                                  f"(capture patches module attributes; a local function or a method cannot be "
                                  f"patched)")
            return
        mod, attr = parse_target(target)
        self.named[target] = (mod, attr)
        module = sys.modules.get(mod)
        if module is None:
            self.pending.setdefault(mod, []).append(attr)
        else:
            self._patch_attr(module, mod, attr)

    def install_hook(self) -> None:
        if self.pending:
            self.hook = _ImportHook(self.pending, self._imported)
            sys.meta_path.insert(0, self.hook)

    def _imported(self, module) -> None:
        for attr in self.pending.pop(module.__name__, []):
            try:
                self._patch_attr(module, module.__name__, attr)
            except KdadbgError as e:
                self.failed[f"{module.__name__}:{attr}"] = str(e).split(": ", 1)[1]   # the why, after the name
                self._warn(str(e))

    def _patch_attr(self, module, mod: str, attr: str) -> None:
        why = no_function(module, mod, attr)
        if why:
            raise KdadbgError(f"capture target {mod}:{attr}: {why}")
        self._patch(getattr(module, attr), f"{mod}:{attr}")
        self.patched.add(f"{mod}:{attr}")

    def _patch(self, fn, impl: str) -> int:
        if id(fn) in self.wrapped:
            return _replace_everywhere(fn, self.wrapped[id(fn)][1]) + 1
        wrapper = self._wrap(fn, impl)
        self.wrapped[id(fn)] = (fn, wrapper)
        return _replace_everywhere(fn, wrapper)

    def resolved(self) -> list[str]:
        """The targets given by name that were patched."""
        return [t for t, (mod, attr) in self.named.items() if f"{mod}:{attr}" in self.patched]

    def unresolved(self) -> list[dict]:
        """The targets given by name that were not patched (yet): ``[{"target", "name", "why", "imported"}]``
        (``name``: ``module:function``, ``target`` as given), ``imported``: whether their module was
        imported in this process."""
        out = []
        for target, (mod, attr) in self.named.items():
            key = f"{mod}:{attr}"
            if key in self.patched:
                continue
            imported = mod in sys.modules
            if key in self.failed:
                why = self.failed[key]
            elif imported:
                why = f"module {mod} was imported, but not through a loader capture can hook"
            else:
                why = _main_script(mod, attr) or _never_imported(mod)
            out.append({"target": target, "name": key, "why": why, "imported": imported})
        return out

    def restore(self) -> None:
        if self.hook is not None and self.hook in sys.meta_path:
            sys.meta_path.remove(self.hook)
        self.hook = None
        for fn, wrapper in self.wrapped.values():
            _replace_everywhere(wrapper, fn)
        self.wrapped.clear()
        self.pending.clear()


def _main_script(mod: str, attr: str) -> str | None:
    """Where module ``mod`` is the script this process runs as ``__main__`` (``python mod.py`` or ``python -m
    mod``), which is never imported under its own name: that, and how to target the function (None otherwise)."""
    import os

    main = sys.modules.get("__main__")
    # (a script's __file__ is gone once it has run, as when capture asks at exit: its loader keeps the path)
    spec = getattr(main, "__spec__", None)
    path = getattr(main, "__file__", None) or getattr(getattr(main, "__loader__", None), "path", None)
    if spec is not None:
        if spec.name != mod:
            return None
    elif not path or os.path.splitext(os.path.basename(path))[0] != mod.rpartition(".")[2]:
        return None
    fn = getattr(main, attr, None)
    home = getattr(fn, "__module__", None)
    if callable(fn) and home and home != "__main__":   # imported into the script: target it where it lives
        how = f"--target {home}:{attr} names it in the module the script imports it from"
    else:
        how = (f"move {attr} into a module the script imports (mykda.py, then --target mykda:{attr}), or capture "
               f"from the script itself with kdadbg.capture(..., targets=[{attr}]) once it is defined")
    return (f"module {mod} is the script the command runs as __main__, never imported as {mod} (capture patches a "
            f"function by name in an imported module only): {how}")


def _never_imported(mod: str) -> str:
    """Why a target's module was never imported: no such module, or the code never imported it. Asks
    the import system without importing anything new (only where the parent package is loaded)."""
    parent = mod.rpartition(".")[0]
    name = mod if not parent or parent in sys.modules else mod.partition(".")[0]
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"no module named {name!r} can be imported here"
    return f"module {mod} was never imported"
