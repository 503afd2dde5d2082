"""``kdadbg.capture``: every selected call of a KDA implementation made inside ``capture(...)``
becomes a v1 dump (its inputs, and ``do``/``dht`` from autograd) and, beside it, the
implementation's own outputs and gradients of that step in the taps-file layout.

    with kdadbg.capture("dumps/", model=model, when="nonfinite") as cap:
        loss = model(x).sum()
        loss.backward()
        opt.step()                        # a step boundary: each optimizer.step() advances cap's step

How it works, and why training computes the same bits:

* the targets (fla's ``chunk_kda``, ours, any function named ``"pkg.mod:fn"`` or passed as a
  callable) are replaced by a wrapper in every loaded module whose attribute *is* the function
  object; a module not imported yet is patched as it is imported; exit restores them all;
* a selected call's differentiable inputs go through an identity autograd function (a view): its
  backward records the gradient flowing into that input from this call alone and hands the same
  tensor on; ``o`` and the final state go back to the caller through the same function (as an
  exact copy), which records ``do`` and ``dht`` (``dht`` stays absent when the final state gets no
  gradient);
* when the backward pass ends (an autograd engine callback), each call whose ``do`` arrived is
  judged by ``when`` and written, then released. Host copies are made with ``non_blocking`` into
  pinned memory on CUDA and only for selected calls.

A call of the wrapper made during a backward pass (activation checkpointing recomputing the
forward) or without grad mode passes straight through; the latter is counted (``calls_no_grad``).
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
import json
import logging
import os
import re
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .config import CHUNK_SIZES, KDAConfig
from .errors import KdadbgError, OutputExists
from .patching import DEFAULT_TARGETS, Patches, parse_target

logger = logging.getLogger("kdadbg.capture")

WHEN = ("always", "nonfinite")
STEPS = ("optimizer", "manual")
INPUTS = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "A_log", "dt_bias")
DUMP_NAME = {"initial_state": "h0"}             # call argument -> dump tensor, where they differ
GRAD_OF = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "beta": "dbeta", "initial_state": "dh0",
           "A_log": "dA_log", "dt_bias": "ddt_bias"}
UNSUPPORTED_FLAGS = {"allow_neg_eigval": "beta in [0, 2)", "return_intermediate_states": "inference mode",
                     "cp_context": "context parallelism"}

_ACTIVE: list["Capture"] = []


@dataclass(frozen=True)
class CallInfo:
    """Where a call came from: what ``calls=`` predicates receive and what the file names say.

    ``call`` counts the target calls of the step (from 0), ``module`` is the innermost module
    running (its name from ``model.named_modules()``, else relative to the outermost module
    running, else its class name; "" outside any module), ``rank`` is the torch.distributed rank
    (None when not initialised), ``impl`` the target as ``module:function``.
    """

    step: int
    call: int
    module: str
    rank: int | None
    impl: str
    inside: str = ""   # the captured call this one ran inside ("impl call N": a wrapper and its inner, both targets)

    @property
    def label(self) -> str:
        parts = [f"s{self.step:04d}", f"c{self.call:03d}"]
        if self.module:
            parts.append(re.sub(r"[^A-Za-z0-9._-]+", "_", self.module))
        if self.rank is not None:
            parts.append(f"r{self.rank}")
        return "-".join(parts)

    def metadata(self) -> dict[str, str]:
        meta = {"capture.step": str(self.step), "capture.call": str(self.call), "capture.module": self.module,
                "capture.impl": self.impl}
        if self.rank is not None:
            meta["capture.rank"] = str(self.rank)
        if self.inside:
            meta["capture.inside"] = self.inside
        return meta


@dataclass
class CapturedCall:
    """One selected call, held on the host until its backward ends (what ``when=`` predicates get).

    ``inputs`` are named as in the dump (``h0`` for ``initial_state``), ``outputs`` hold ``o`` and
    ``ht``, ``grads`` hold ``do``, ``dht`` and the inputs' gradients (``dq`` ... ``ddt_bias``).
    """

    info: CallInfo
    config: KDAConfig
    nbytes: int
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    precision: str | None = None   # kdadbg's mode of the call (our kernels' precision=), None for another's

    def nonfinite(self) -> list[str]:
        """Names of the float tensors (inputs, outputs, gradients) holding a NaN or an Inf."""
        tensors = {**self.inputs, **self.outputs, **self.grads}
        return [n for n, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]


class _Unsupported(Exception):
    """A call the dump format cannot express; it runs uncaptured."""


class _Record(torch.autograd.Function):
    """Identity on the way forward; on the way back, records the incoming gradient as ``name`` and
    passes the same tensor on. An input goes through as a view; an output as a copy (the same bits),
    which the caller may then modify in place as it could the original."""

    @staticmethod
    def forward(ctx, x, session, call, name, copy):
        ctx.session, ctx.call, ctx.name = session, call, name
        return x.clone() if copy else x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.session._record(ctx.call, ctx.name, grad)
        return grad, None, None, None, None


def _fla_signature(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kwargs):
    """fla's leading ``chunk_kda`` parameters: the stand-in for a target without a readable signature."""


FLA_POSITIONAL = tuple(inspect.signature(_fla_signature).parameters)[:-1]   # the order fla's versions share


class _Bound:
    """A call's arguments by name, with the target's defaults; ``set`` swaps one for the call.

    Positional arguments that land in the target's ``*args`` (a wrapper ``(*a, **kw)``) are named by
    their position in fla's ``chunk_kda`` (``FLA_POSITIONAL``) where the signature names none there;
    ``unnamed`` counts those past it.
    """

    def __init__(self, sig: inspect.Signature, args, kwargs):
        self.sig = sig
        self.ba = sig.bind(*args, **kwargs)
        params = sig.parameters.values()
        self.var_kw = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
        self.var_pos = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
        start = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
        extra = self.ba.arguments.get(self.var_pos, ()) if self.var_pos else ()
        self.positional = {FLA_POSITIONAL[start + i]: i for i in range(len(extra)) if start + i < len(FLA_POSITIONAL)
                           and FLA_POSITIONAL[start + i] not in sig.parameters}
        self.unnamed = len(extra) - len(self.positional)

    def _extra(self) -> dict:
        return self.ba.arguments.get(self.var_kw, {}) if self.var_kw else {}

    def names(self) -> list[str]:
        """The names the call's arguments were bound to."""
        named = [n for n in self.ba.arguments if n not in (self.var_kw, self.var_pos)]
        return named + list(self.positional) + list(self._extra())

    def get(self, name: str, default=None):
        if name in self.ba.arguments and name not in (self.var_kw, self.var_pos):
            return self.ba.arguments[name]
        if name in self.positional:
            return self.ba.arguments[self.var_pos][self.positional[name]]
        if name in self._extra():
            return self._extra()[name]
        p = self.sig.parameters.get(name)
        if p is not None and p.default is not p.empty and p.kind is not p.VAR_KEYWORD:
            return p.default
        return default

    def set(self, name: str, value) -> None:
        if name in self.ba.arguments and name not in (self.var_kw, self.var_pos):
            self.ba.arguments[name] = value
        elif name in self.positional:
            extra = list(self.ba.arguments[self.var_pos])
            extra[self.positional[name]] = value
            self.ba.arguments[self.var_pos] = tuple(extra)
        else:
            self._extra()[name] = value

    def call(self, fn):
        return fn(*self.ba.args, **self.ba.kwargs)


def _signature(fn) -> inspect.Signature:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return inspect.signature(_fla_signature)


def call_config(get: Callable[..., Any], q, v) -> KDAConfig:
    """The dump config of one call from its flags (fla's ``chunk_kda`` names and defaults).

    ``use_gate_in_kernel`` with ``lower_bound`` -> gate ``lower_bound``, without -> ``softplus``,
    else ``none``; ``use_qk_l2norm_in_kernel`` -> ``qk_l2norm``; ``use_beta_sigmoid_in_kernel`` ->
    ``beta_sigmoid``; ``state_v_first`` -> ``state_layout`` ``vk`` (default ``kv``, fla's [K,V]);
    ``chunk_size`` (fla's default 64 where the target has none); ``scale`` (default K**-0.5).
    Raises ``_Unsupported`` for a call format v1 cannot express.
    """
    if not (isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor) and q.ndim == 4 and v.ndim == 4):
        raise _Unsupported("q and v are not [B,T,H,*] tensors")
    H, K = q.shape[2], q.shape[3]
    if v.shape[2] % H:
        raise _Unsupported(f"v has {v.shape[2]} heads, q {H}: dump format v1 needs the value heads to be a multiple "
                           f"of the q/k heads (GVA)")
    for flag, what in UNSUPPORTED_FLAGS.items():
        value = get(flag)
        if value is not None and value is not False:
            raise _Unsupported(f"{flag} ({what}) is not in dump format v1")
    chunk = get("chunk_size", 64)
    if chunk not in CHUNK_SIZES:
        raise _Unsupported(f"chunk_size {chunk}: dump format v1 has {', '.join(map(str, CHUNK_SIZES))}")
    lower = get("lower_bound")
    gate = "none" if not get("use_gate_in_kernel", False) else ("softplus" if lower is None else "lower_bound")
    v_first = bool(get("state_v_first", False) or get("transpose_state_layout", False))
    scale = get("scale")
    return KDAConfig(scale=K ** -0.5 if scale is None else float(scale), chunk_size=int(chunk), gate=gate,
                     lower_bound=-5.0 if lower is None else float(lower),
                     qk_l2norm=bool(get("use_qk_l2norm_in_kernel", False)),
                     beta_sigmoid=bool(get("use_beta_sigmoid_in_kernel", False)),
                     state_layout="vk" if v_first else "kv")


def _rank() -> int | None:
    d = torch.distributed
    return d.get_rank() if d.is_available() and d.is_initialized() else None


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class _ModuleStack:
    """The modules running now (global forward hooks), to name a call by the innermost one."""

    def __init__(self, model: torch.nn.Module | None):
        self._local = threading.local()
        self._names = None if model is None else {id(m): n for n, m in model.named_modules()}
        self._roots: dict[int, tuple[weakref.ref, dict[int, str]]] = {}
        self._handles = []

    def _stack(self) -> list:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def install(self) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._handles = [register_module_forward_pre_hook(lambda m, args: self._stack().append(m)),
                         register_module_forward_hook(self._pop, always_call=True)]

    def _pop(self, module, args, output):
        stack = self._stack()
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is module:
                del stack[i]
                break

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def current(self) -> str:
        stack = self._stack()
        if not stack:
            return ""
        module, names = stack[-1], self._names
        if names is None:
            root = stack[0]
            ref, names = self._roots.get(id(root), (None, None))
            if ref is None or ref() is not root:
                names = {id(m): n for n, m in root.named_modules()}
                self._roots[id(root)] = (weakref.ref(root), names)
        return names.get(id(module)) or type(module).__name__


class Capture:
    """A capture session: a context manager and a decorator (see :func:`capture`)."""

    def __init__(self, out, *, targets=None, model=None, calls=None, modules=None, first=None,
                 every: int = 1, when="always", max_bytes=None, steps: str = "optimizer", manifest=None,
                 force: bool = False, on_log: Callable[[str], None] | None = None):
        self.targets_requested = targets is not None   # else the defaults, which need not all be there
        if targets is None:
            targets = DEFAULT_TARGETS
        if isinstance(targets, (str,)) or callable(targets):
            targets = [targets]
        if isinstance(modules, str):
            modules = [modules]
        if not (when in WHEN or callable(when)):
            raise KdadbgError(f"capture when={when!r}: expected one of {', '.join(WHEN)} or a predicate")
        if steps not in STEPS:
            raise KdadbgError(f"capture steps={steps!r}: expected one of {', '.join(STEPS)}")
        if not isinstance(every, int) or every < 1:
            raise KdadbgError(f"capture every={every!r}: expected an integer >= 1")
        if first is not None and (not isinstance(first, int) or first < 1):   # 0 would write nothing
            raise KdadbgError(f"capture first={first!r}: expected an integer >= 1 (the most dumps to write)")
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):
            raise KdadbgError(f"capture max_bytes={max_bytes!r}: expected a number of bytes >= 0")
        for target in targets:
            if not callable(target):
                parse_target(target)
        if calls is not None and not callable(calls):
            try:
                calls = frozenset(int(c) for c in calls)
            except (TypeError, ValueError):
                raise KdadbgError(f"capture calls={calls!r}: expected call indices or a predicate") from None
            if not calls or min(calls) < 0:   # nothing, or an index no call has: would select none
                raise KdadbgError(f"capture calls={sorted(calls)!r}: expected call indices >= 0 within a step "
                                  f"(0 is a step's first KDA call), found {'none' if not calls else min(calls)}")
        self.out = Path(out)
        self.targets, self.model, self.calls, self.modules = list(targets), model, calls, list(modules or [])
        self.first, self.every, self.when, self.max_bytes, self.steps = first, every, when, max_bytes, steps
        self.manifest, self.force, self.on_log = manifest, force, on_log
        self.run: str | None = None       # set by `kdadbg capture` in each process it starts (capture_run.boot)
        self.written: list[dict] = []     # one entry per dump written (the manifest's "dumps")
        self.skipped: list[dict] = []     # selected calls not written, and why
        self.errors: list[str] = []       # calls selected and judged but not written, and why
        self.refused = 0                  # of those, how many because a file of the name existed (no force)
        self.calls_seen = 0
        self.calls_no_grad = 0            # calls made with grad mode off (torch.no_grad, inference_mode): no
                                          # backward to capture; they take no call index
        self.excluded: dict[str, int] = {}   # calls not written, counted by the option that left them out:
                                             # every, modules, calls, first (before the call), when (after)
        self._seen_modules: set[str] = set()
        self._seen_calls: set[int] = set()
        self._seen_steps: list[int] = []     # [first, last] step with a call
        self._called: set[str] = set()       # the impls (module:function) called at all, grad mode on or off
        self._step, self._call = 0, 0
        self._pending: list[CapturedCall] = []
        self._events: list = []
        self._queued_task = None
        self._lock = threading.RLock()
        self._nested = threading.local()   # .calls: the captured calls running in this thread, outermost first
        self._active = False
        self._patches = self._stack = None
        self._step_hook = None
        self._warned: set[str] = set()
        self._manifest_path = None
        self._manifests_written: set[Path] = set()
        self._closed = False
        self.warn_unresolved = True   # close() warns of requested targets never patched (kdadbg capture's
                                      # children leave that to the parent, which sees every process)
        self.log_unwritten = True     # each call not written is logged as an error (kdadbg capture's children
                                      # leave that to the parent, which prints each once from the manifests)

    def __enter__(self) -> "Capture":
        if _ACTIVE:
            raise KdadbgError("capture: another capture is active; nest none")
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise KdadbgError(f"capture: cannot create the output folder {self.out} ({e.strerror})") from None
        self._patches = Patches(self._wrap, self._warn_target)
        try:
            for target in self.targets:
                self._patches.add(target)
        except KdadbgError:
            self._patches.restore()
            raise
        self._patches.install_hook()
        self._stack = _ModuleStack(self.model)
        self._stack.install()
        if self.steps == "optimizer":
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._step_hook = register_optimizer_step_post_hook(lambda opt, args, kwargs: self.step())
        self._active = True
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End the session (what leaving the ``with`` block does): restore the targets, drop calls
        whose backward never came, write the manifest. Safe to call twice."""
        if not self._active:
            return
        self._active = False
        self._closed = True
        if self.warn_unresolved and self.targets_requested:
            for u in self.unresolved:   # said once: the same line as when its module was imported without it
                self._warn(f"capture target {u['name']}: {u['why']}")
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        self._drop_unfinished()
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
        self._stack.remove()
        self._patches.restore()
        self._write_manifest()

    def __call__(self, fn):
        """Decorator form: each call of ``fn`` runs inside this session (counters carry on)."""
        @functools.wraps(fn)
        def captured(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        return captured

    def step(self) -> None:
        """Advance the step (call indices restart at 0); calls of the step still without a backward
        are dropped. Each ``optimizer.step()`` does this too unless ``steps="manual"``."""
        with self._lock:
            self._drop_unfinished()
            self._step += 1
            self._call = 0

    @property
    def current_step(self) -> int:
        return self._step

    @property
    def unresolved(self) -> list[dict]:
        """The targets given by name not patched so far (their module not imported, or without the
        function): ``[{"target", "name" (module:function), "why", "imported"}]``."""
        return self._patches.unresolved() if self._patches is not None else []

    @property
    def seen(self) -> dict:
        """What the calls seen were, to say what a selection could have matched: ``{"modules": [names],
        "calls": [indices within a step], "steps": [first, last] (empty before any call)}``."""
        return {"modules": sorted(self._seen_modules), "calls": sorted(self._seen_calls),
                "steps": list(self._seen_steps)}

    def manifest_data(self) -> dict:
        return {"schema": 1, "out": str(self.out), "calls_seen": self.calls_seen, "calls_no_grad": self.calls_no_grad,
                "dumps": list(self.written),
                "skipped": list(self.skipped), "excluded": dict(self.excluded), "seen": self.seen,
                "errors": list(self.errors), "refused": self.refused,
                "closed": self._closed, "targets": {"requested": self.targets_requested,
                                                    "patched": self._patches.resolved() if self._patches else [],
                                                    "called": sorted(self._called),
                                                    "unresolved": self.unresolved}}

    def _wrap(self, fn, impl: str):
        sig = _signature(fn)

        @functools.wraps(fn)
        def kda_captured(*args, **kwargs):
            return self._run_call(fn, impl, sig, args, kwargs)

        kda_captured.__kdadbg_capture_of__ = fn
        return kda_captured

    def _run_call(self, fn, impl, sig, args, kwargs):
        if not self._active or _in_backward():
            return fn(*args, **kwargs)
        with self._lock:   # (manifest_data sorts the set from another thread)
            self._called.add(impl)
        if not torch.is_grad_enabled():   # evaluation: counted, so that a capture of it says why nothing came
            with self._lock:
                self.calls_no_grad += 1
            self._warn(f"capture ({impl}): a call with grad mode off (torch.no_grad, inference_mode) runs "
                       f"uncaptured: no backward to capture")
            return fn(*args, **kwargs)
        try:
            bound = _Bound(sig, args, kwargs)
        except TypeError:
            return fn(*args, **kwargs)  # the target's own error
        outer = getattr(self._nested, "calls", None) or []   # captured calls running in this thread
        with self._lock:
            info = CallInfo(self._step, self._call, self._stack.current(), _rank(), impl,
                            f"{outer[-1].impl} call {outer[-1].call}" if outer else "")
            self._call += 1
            self.calls_seen += 1
            self._seen_modules.add(info.module)
            self._seen_calls.add(info.call)
            self._seen_steps = [self._seen_steps[0] if self._seen_steps else info.step, info.step]
            left_out = self._left_out_by(info)
            if left_out is not None:
                self._exclude(left_out)
        call = self._prepare(info, bound) if left_out is None else None
        if call is None:
            return fn(*args, **kwargs)
        if not hasattr(self._nested, "calls"):
            self._nested.calls = []
        self._nested.calls.append(info)
        try:
            out = bound.call(fn)
        except BaseException:
            self._forget(call)
            raise
        finally:
            self._nested.calls.pop()
        o, ht = (out, None) if isinstance(out, torch.Tensor) else (
            (out[0], out[1] if len(out) > 1 else None) if isinstance(out, (tuple, list)) and out else (None, None))
        if not isinstance(o, torch.Tensor) or not o.requires_grad:
            self._forget(call)
            self._skip(info, "its output o needs no gradient")
            return out
        call.outputs["o"] = self._host(o)
        wrapped = [_Record.apply(o, self, call, "do", True)]
        if isinstance(ht, torch.Tensor):
            call.outputs["ht"] = self._host(ht)
            wrapped.append(_Record.apply(ht, self, call, "dht", True) if ht.requires_grad else ht)
        if isinstance(out, torch.Tensor):
            return wrapped[0]
        return type(out)([*wrapped, *out[len(wrapped):]]) if isinstance(out, list) else (*wrapped, *out[len(wrapped):])

    def _left_out_by(self, info: CallInfo) -> str | None:
        """The first option that leaves the call out (``every``, ``modules``, ``calls``, ``first``); None: selected."""
        if info.step % self.every:
            return "every"
        if self.modules and not any(fnmatch.fnmatchcase(info.module, p) for p in self.modules):
            return "modules"
        if self.calls is not None and not (self.calls(info) if callable(self.calls) else info.call in self.calls):
            return "calls"
        if self.first is not None:
            held = len(self._pending) if self.when == "always" else 0
            if len(self.written) + held >= self.first:
                return "first"
        return None

    def _exclude(self, option: str) -> None:
        with self._lock:
            self.excluded[option] = self.excluded.get(option, 0) + 1

    def _prepare(self, info: CallInfo, bound: _Bound) -> CapturedCall | None:
        """Host copies of a selected call's inputs, and its differentiable inputs swapped for recording
        views; None (the call runs uncaptured) when the dump format cannot hold it."""
        q, v = bound.get("q"), bound.get("v")
        if bound.unnamed:
            self._skip(info, f"{bound.unnamed} positional argument{'s' if bound.unnamed > 1 else ''} after fla's "
                             f"{FLA_POSITIONAL[-1]} reached the target's *{bound.var_pos}, which names none: pass "
                             f"them by keyword (fla's versions order the later flags differently)")
            return None
        if q is None or v is None:
            self._skip(info, f"found no {' or '.join(n for n in ('q', 'v') if bound.get(n) is None)} among the "
                             f"call's arguments ({', '.join(bound.names()) or 'none'}): expected fla's chunk_kda "
                             f"names, or q, k, v, g, beta first by position")
            return None
        try:
            config = call_config(bound.get, q, v)
        except _Unsupported as e:
            self._skip(info, str(e))
            return None
        tensors = {n: bound.get(n) for n in INPUTS if isinstance(bound.get(n), torch.Tensor)}
        diff = [n for n in GRAD_OF if n in tensors and tensors[n].requires_grad]
        if not diff:
            self._skip(info, "no input needs a gradient")
            return None
        B, T, _, K = q.shape
        H, V = v.shape[2], v.shape[3]   # states and gate parameters are per value head (GVA: more than q's)
        state = (q.shape[0] if bound.get("cu_seqlens") is None else bound.get("cu_seqlens").numel() - 1) * H * K * V * 4
        nbytes = sum(_nbytes(t) for t in tensors.values()) + sum(_nbytes(tensors[n]) for n in diff) \
            + 2 * _nbytes(v) + (2 * state if bound.get("output_final_state") else 0)
        with self._lock:
            held = sum(c.nbytes for c in self._pending)
            over = self.max_bytes is not None and held + nbytes > self.max_bytes
            if not over:
                # our kernels' own precision= (bf16 by default): the theirs file records it, so that diff judges
                # it at that mode's tolerances or says to (a clean bf16 step failed at fp32's: a user trial)
                prec = bound.get("precision")
                call = CapturedCall(info, config, nbytes, precision=prec if prec in ("fp32", "bf16") else None)
                self._pending.append(call)
        if over:   # raised in the training code: the manifest says first that capture stopped it
            msg = (f"capture: call {info.label} ({info.impl}) would hold {fmt_bytes(nbytes)} on the host, "
                   f"{fmt_bytes(held)} already held: over max_bytes={self.max_bytes} ({fmt_bytes(self.max_bytes)}); "
                   f"narrow calls=/modules=/first= or raise max_bytes")
            self.errors.append(f"{msg} (capture raised this in the command, ending it)")
            self._write_manifest()
            raise KdadbgError(msg)
        self._say(f"capture {info.label} ({info.impl}): holding ~{fmt_bytes(nbytes)} on the host "
                  f"({fmt_bytes(held + nbytes)} in all)")
        for name, t in tensors.items():
            call.inputs[DUMP_NAME.get(name, name)] = self._host(t)
        if config.gate != "none":
            for name, shape in (("A_log", (H,)), ("dt_bias", (H * K,))):
                if name not in call.inputs:   # fla's lower_bound gate without A_log, or no dt_bias: 0 adds nothing
                    call.inputs[name] = torch.zeros(shape, dtype=torch.float32)
                    call.notes[f"capture.default.{name}"] = "zeros (not passed to the call)"
        else:
            call.inputs.pop("A_log", None)
            call.inputs.pop("dt_bias", None)
        for name in diff:
            bound.set(name, _Record.apply(tensors[name], self, call, GRAD_OF[name], False))
        return call

    def _forget(self, call: CapturedCall) -> None:
        with self._lock:
            if call in self._pending:
                self._pending.remove(call)

    def _host(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if t.device.type == "cpu":
            return t.clone()
        if t.device.type != "cuda":
            return t.to("cpu")
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        out.copy_(t, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._events.append(event)
        return out

    def _record(self, call: CapturedCall, name: str, grad) -> None:
        if grad is None or not self._active:
            return
        call.grads[name] = self._host(grad)
        task = torch._C._current_graph_task_id()
        if task != -1 and task != self._queued_task:
            self._queued_task = task
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)

    def _backward_done(self) -> None:
        """End of a backward pass: judge and write every call whose ``do`` arrived."""
        for event in self._events:
            event.synchronize()
        self._events.clear()
        with self._lock:
            done = [c for c in self._pending if "do" in c.grads]
            self._pending = [c for c in self._pending if "do" not in c.grads]
        for call in done:
            self._finish(call)

    def _finish(self, call: CapturedCall) -> None:
        bad = call.nonfinite()
        if self.when == "always":
            reason = "always"
        elif self.when == "nonfinite":
            reason = "nonfinite" if bad else None
        else:
            reason = "predicate" if self.when(call) else None
        if reason is None:
            self._exclude("when")
            return
        if self.first is not None and len(self.written) >= self.first:
            self._exclude("first")
            return
        try:
            self.written.append(write_call(self.out, call, reason, bad, force=self.force, run=self.run))
        except KdadbgError as e:
            self.errors.append(str(e))
            self.refused += isinstance(e, OutputExists)
            self._say(f"capture {call.info.label}: not written: {e}", logging.ERROR if self.log_unwritten
                      else logging.DEBUG)
            self._write_manifest()
            return
        self._say(f"capture {call.info.label}: wrote {self.written[-1]['dump']} ({reason})")
        self._write_manifest()  # kept current, so a process that dies later still lists its dumps

    def _drop_unfinished(self) -> None:
        with self._lock:
            dropped, self._pending = self._pending, []
        for call in dropped:
            self._skip(call.info, "no gradient of o arrived (no backward in its step)")

    def _skip(self, info: CallInfo, why: str) -> None:
        self.skipped.append({"step": info.step, "call": info.call, "module": info.module, "impl": info.impl,
                             "why": why})
        self._warn(f"capture {info.label} ({info.impl}): not captured: {why}")

    def _warn_target(self, msg: str) -> None:
        if self.warn_unresolved:
            self._warn(msg)

    def _warn(self, msg: str) -> None:
        key = re.sub(r"^capture s\d+-c\d+\S*", "capture", msg)
        if key not in self._warned:
            self._warned.add(key)
            self._say(msg, logging.WARNING)

    def _say(self, msg: str, level: int = logging.INFO) -> None:
        logger.log(level, msg)
        if self.on_log is not None:
            self.on_log(msg)

    def _write_manifest(self) -> None:
        if self.manifest is False:
            return
        from .fileio import atomic_write_text

        if self._manifest_path is None:  # named by the rank once there is one (it outlives the process group)
            rank = _rank()
            path = Path(self.manifest or self.out / ("manifest.json" if rank is None else f"manifest-r{rank}.json"))
            if rank is not None or self.manifest:
                self._manifest_path = path
            if not self.manifest and not self.force and path.exists() and path not in self._manifests_written:
                # an earlier session's record: kept (it was replaced, losing the list of its dumps)
                earlier, n = path, 1
                while path.exists():
                    path, n = earlier.with_name(f"{earlier.stem}-{os.getpid()}{'' if n == 1 else f'-{n}'}.json"), n + 1
                self._manifest_path = path
                self._say(f"capture: {earlier} is an earlier session's (kept; --force replaces it): this "
                          f"session's manifest is {path.name}")
        else:
            path = self._manifest_path
        self._manifests_written.add(path)
        atomic_write_text(json.dumps(self.manifest_data(), indent=2), path, force=True)


def _same_run_elsewhere(path: Path, run: str | None) -> bool:
    """Whether ``path`` is a dump another process of the same ``kdadbg capture`` run wrote."""
    if run is None or not path.exists():
        return False
    from .fileio import read_header

    try:
        meta = read_header(path)[1]
    except KdadbgError:
        return False
    return meta.get("capture.run") == run and meta.get("capture.pid") != str(os.getpid())


def write_call(out: Path, call: CapturedCall, reason: str, nonfinite: list[str], force: bool = False,
               run: str | None = None) -> dict:
    """Write one captured call: ``<label>.safetensors`` (a v1 dump: the inputs in their dtypes, ``do``,
    ``dht`` when the final state got a gradient) and ``<label>.theirs.safetensors`` (the
    implementation's outputs and gradients, taps-file layout, no taps). Returns the manifest entry.
    ``run``: the ``kdadbg capture`` run's id; a name another of its processes wrote (two Python processes
    without ranks, each with its step 0 call 0) gets ``-p<pid>``: never overwritten, even with ``force``."""
    from .chunks import chunk_table
    from .dump import validate
    from .fileio import atomic_save
    from .outputs import check_output
    from .tapsfile import chunk_rows, taps_metadata, write_taps_file

    info, config = call.info, call.config
    label = info.label
    if _same_run_elsewhere(out / f"{label}.safetensors", run):
        label = f"{label}-p{os.getpid()}"
    dump, theirs = out / f"{label}.safetensors", out / f"{label}.theirs.safetensors"
    for path in (dump, theirs):   # both refused before either is written: no dump without its theirs file
        check_output("", path, force)
    origin = {**info.metadata(), "capture.reason": reason, "capture.nonfinite": ",".join(nonfinite),
              "capture.theirs": theirs.name, **call.notes,
              **({"capture.run": run, "capture.pid": str(os.getpid())} if run is not None else {})}
    tensors = {**call.inputs, "do": call.grads["do"]}
    if "dht" in call.grads:
        tensors["dht"] = call.grads["dht"]
    meta = {**origin, **config.to_metadata()}
    inputs, _ = validate(str(dump), tensors, meta, allow_nonfinite=True)
    outputs = {n: t for n, t in call.outputs.items()}
    for name in GRAD_OF.values():
        if name in call.grads:
            outputs[name] = call.grads[name]
    if "ddt_bias" in outputs:
        outputs["ddt_bias"] = outputs["ddt_bias"].reshape(inputs.dt_bias.shape)
    B, T = inputs.shape[:2]
    rows = chunk_rows(chunk_table(B, T, inputs.cu_seqlens, config.chunk_size), 0, 0)
    atomic_save(tensors, meta, dump, force=force)
    write_taps_file(theirs, outputs, {}, rows, range(inputs.HV),
                    {**taps_metadata("capture", dump, config, call.precision, inputs=inputs), **origin}, force=force)
    _, _, H, K, V = inputs.shape
    sizes = {"B": B, "T": T, "N": None if inputs.cu_seqlens is None else int(inputs.cu_seqlens.numel()) - 1,
             "H": H, "HV": inputs.HV, "K": K, "V": V}
    return {"dump": str(dump), "theirs": str(theirs), "step": info.step, "call": info.call, "module": info.module,
            "rank": info.rank, "impl": info.impl, "reason": reason, "nonfinite": nonfinite,
            "dht": "dht" in call.grads, "outputs": sorted(outputs), "inside": info.inside or None,
            "sizes": sizes, "dtype": str(inputs.q.dtype).removeprefix("torch."), "chunk_size": config.chunk_size,
            "gate": config.gate}


def capture(out, *, targets=None, model: torch.nn.Module | None = None, calls=None, modules=None,
            first: int | None = None, every: int = 1, when="always", max_bytes: int | None = None,
            steps: str = "optimizer", manifest=None, force: bool = False,
            on_log: Callable[[str], None] | None = None) -> Capture:
    """Capture the KDA calls of training as dumps in the folder ``out`` (a context manager, or a decorator).

    Args:
        targets: what to wrap: ``"fla"`` (fla's ``chunk_kda``, however imported), ``"kdadbg"``
            (``kdadbg_kernels.chunk_kda``), ``"pkg.mod:fn"`` (a module-level function with fla's
            ``chunk_kda`` calling convention, patched when its module is imported if it is not yet)
            or a callable; default both of ours and fla's. A target given by name that was never
            patched (no such module or function, or its module never imported) is listed in
            ``cap.unresolved`` and, unless it came by default (fla need not be installed), warned of.
        model: names calls by ``model.named_modules()`` (e.g. ``layers.3.attn``); without it, by the
            path from the outermost module running, or the class name.
        calls: call indices within a step (``[0, 2]``) or a predicate on :class:`CallInfo`.
        modules: glob patterns of module names (``"layers.*.attn"``); a call matching one is selected.
        first: write at most this many dumps; every: only steps ``0, k, 2k, ...``.
        when: ``"always"``, ``"nonfinite"`` (a NaN/Inf in an input, output or gradient of the call)
            or a predicate on :class:`CapturedCall`, judged once the call's backward has run.
        max_bytes: refuse (``KdadbgError``, before the call runs) a selected call whose host copies
            would take the held total over this many bytes.
        steps: ``"optimizer"``: each ``optimizer.step()`` of any torch optimizer ends a step (and
            ``cap.step()``); ``"manual"``: only ``cap.step()``.
        manifest: path of the JSON manifest written on exit (default ``out/manifest.json``; False: none).
        force: replace existing dumps of the same name (else each is refused, listed in ``errors`` and
            counted in ``refused``; an existing file is never overwritten).
        on_log: also send each log line (size estimates, files written, skips) to this callback;
            they go to the ``logging`` logger ``kdadbg.capture`` in any case.

    Example:
        >>> with kdadbg.capture("dumps/", model=model, modules="layers.*", first=4) as cap:
        ...     for x in batches:
        ...         model(x).sum().backward(); opt.step(); opt.zero_grad()
        >>> cap.written[0]["dump"]          # 'dumps/s0000-c000-layers.0.attn.safetensors'
    """
    return Capture(out, targets=targets, model=model, calls=calls, modules=modules, first=first, every=every,
                   when=when, max_bytes=max_bytes, steps=steps, manifest=manifest, force=force, on_log=on_log)
