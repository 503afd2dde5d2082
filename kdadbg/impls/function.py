"""``--impl PATH.py:FUNCTION`` or ``--impl MODULE:FUNCTION``: any function with fla's ``chunk_kda``
calling convention (README, "Debugging your own kernel")::

    fn(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens, chunk_size,
       use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, lower_bound, A_log,
       dt_bias, state_v_first, **kw) -> (o, final_state) or (o, final_state, taps)

kdadbg builds the keyword arguments from the dump's config, leaving out those the function does not
accept (by its signature) when their value is the neutral one, and refusing with one line the dump
that needs one it cannot take. Leaves (``q k v g beta``, ``initial_state``, ``A_log``, ``dt_bias``)
are passed on the chosen device in the dump's dtypes, requiring grad; kdadbg then gets every gradient
itself with ``torch.autograd.grad((o, ht), leaves, (do, dht))``. ``taps`` is a dict in the registry's
layout and units, or ``(dict, TapsSpec)`` in the function's own conventions.

The function may carry attributes: ``supports(config, shapes) -> (ok, why)``, ``forward_only = True``,
``taps_spec = TapsSpec(...)``. A module attribute that is an :class:`~.base.Implementation` instance
is used as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from pathlib import Path

import torch

from kdadbg_kernels.taps import REGISTRY, TapSelection

from ..chunks import chunk_table
from ..config import KDAConfig, KDAInputs
from ..errors import EXIT_BAD_INPUT, KdadbgError
from .base import (STORAGE_DTYPES, Implementation, ImplError, ImplRun, TapsSpec, check_tap_shapes, convert_taps,
                   select_taps)
from .tapsfile import checked_outputs

GRAD_OF = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "beta": "dbeta", "initial_state": "dh0",
           "A_log": "dA_log", "dt_bias": "ddt_bias"}


class ImportFailed(ImplError):
    """The implementation's file raised (or exited) while it was imported: bad input, exit 2, not a numerical
    failure."""

    exit_code = EXIT_BAD_INPUT


def load_callable(spec: str):
    """``PATH.py:NAME`` (a file, imported under a private module name) or ``MODULE:NAME`` (importable)."""
    if not torch.cuda.is_available():   # a Triton kernel can then run only under the interpreter, which
        os.environ.setdefault("TRITON_INTERPRET", "1")   # is chosen when its module decorates: before import
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise KdadbgError(f"--impl {spec}: expected ours, reference, a registered name, PATH.py:FUNCTION or "
                          f"MODULE:FUNCTION")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise KdadbgError(f"--impl {spec}: {target}: " + ("is a folder, expected a Python file" if path.is_dir()
                                                             else "no such file"))
        name = f"kdadbg_user_impl_{abs(hash(str(path.resolve())))}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        sys.path.insert(0, str(path.resolve().parent))
        argv, sys.argv = sys.argv, [str(path)]   # a module that parses its command line at import sees none
        try:
            mod_spec.loader.exec_module(module)
        except SystemExit as e:
            raise ImportFailed(f"--impl {spec}: importing {target} called sys.exit({e.code!r})") from None
        except Exception as e:
            raise ImportFailed(f"--impl {spec}: importing {target} raised {type(e).__name__}: {e}",
                               detail=traceback.format_exc()) from None
        finally:
            sys.argv = argv
            sys.path.remove(str(path.resolve().parent))
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise KdadbgError(f"--impl {spec}: cannot import module {target!r}: {e}") from None
        except SystemExit as e:
            raise ImportFailed(f"--impl {spec}: importing {target} called sys.exit({e.code!r})") from None
        except Exception as e:
            raise ImportFailed(f"--impl {spec}: importing {target} raised {type(e).__name__}: {e}",
                               detail=traceback.format_exc()) from None
    if not hasattr(module, attr):
        found = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise KdadbgError(f"--impl {spec}: {target} has no {attr!r} (it has: {', '.join(found) or 'nothing callable'})")
    obj = getattr(module, attr)
    if not (callable(obj) or isinstance(obj, Implementation)):
        raise KdadbgError(f"--impl {spec}: {attr!r} is a {type(obj).__name__}, not a function")
    return obj


def call_kwargs(fn, inputs: KDAInputs, config: KDAConfig, h0, name: str) -> tuple[dict, bool]:
    """Keyword arguments for ``fn`` from the dump's config: ``(kwargs, state_v_first passed)``."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    var_kw = not params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    K = inputs.shape[3]
    gate = config.gate != "none"
    wanted = {  # name: (value, neutral: leaving it out means the same)
        "scale": (config.scale, abs(config.scale - K ** -0.5) <= 1e-12 * K ** -0.5),
        "initial_state": (h0, h0 is None),
        "output_final_state": (True, False),
        "cu_seqlens": (inputs.cu_seqlens, inputs.cu_seqlens is None),
        "chunk_size": (config.chunk_size, True),
        "use_qk_l2norm_in_kernel": (config.qk_l2norm, not config.qk_l2norm),
        "use_gate_in_kernel": (gate, not gate),
        "use_beta_sigmoid_in_kernel": (config.beta_sigmoid, not config.beta_sigmoid),
        "lower_bound": (config.lower_bound if config.gate == "lower_bound" else None, config.gate != "lower_bound"),
        "A_log": (inputs.A_log, not gate),
        # fla's convention: dt_bias flat [HV*K] (its layer's parameter); its gradient comes back so
        "dt_bias": (None if inputs.dt_bias is None else inputs.dt_bias.reshape(-1), not gate),
        "state_v_first": (config.state_layout == "vk", True),   # if not accepted, states go as [K,V]
    }
    kwargs, missing = {}, []
    for key, (value, neutral) in wanted.items():
        if var_kw or key in params:
            kwargs[key] = value
        elif not neutral and key != "output_final_state":
            missing.append(f"{key}={_show(value)}")
    required = [p.name for i, p in enumerate(params.values())
                if i >= 5 and p.default is inspect.Parameter.empty
                and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
                and p.name not in kwargs]
    if missing:
        raise KdadbgError(f"--impl {name}: the dump needs {', '.join(missing)}, but the function takes "
                          + ("no such argument" if len(missing) == 1 else "none of these arguments"))
    if required:
        raise KdadbgError(f"--impl {name}: the function requires {', '.join(required)}, which kdadbg cannot give "
                          f"(it passes q, k, v, g, beta and fla's chunk_kda keywords)")
    if params:   # what else the call cannot bind (too few positional parameters, say): refused here, not raised in it
        try:
            inspect.signature(fn).bind(*range(5), **kwargs)
        except TypeError as e:
            raise KdadbgError(f"--impl {name}: kdadbg calls it with q, k, v, g, beta by position and fla's chunk_kda "
                              f"keywords ({', '.join(kwargs) or 'none'}), which its signature refuses: {e}") from None
    return kwargs, "state_v_first" in kwargs


def _show(v) -> str:
    if isinstance(v, torch.Tensor):
        return "a tensor"
    return repr(v)


def no_gpu_hint(e: BaseException, name: str) -> str:
    """Where Triton found no GPU driver (``0 active drivers``): what runs such kernels on the CPU."""
    if "active drivers" not in str(e):
        return ""
    if name.split(".")[0].split(":")[0] == "fla":
        return ("; Triton found no GPU: on the CPU fla's chunk_kda runs as --impl fla, which sets up the Triton "
                "interpreter for it (float32 dumps)")
    return "; Triton found no GPU: on the CPU its kernels need the Triton interpreter (TRITON_INTERPRET=1 before they " \
           "are imported)"


def own_precision_note(fn, name: str, precision: str) -> str | None:
    """A note when the function has a ``precision`` parameter whose default is another of kdadbg's modes
    (our autograd op ``kdadbg_kernels:chunk_kda`` runs in bf16 mode by default): kdadbg passes it nothing,
    so it runs in its own mode while ``--precision`` sets the tolerances it is judged by."""
    try:
        p = inspect.signature(fn).parameters.get("precision")
    except (TypeError, ValueError):
        return None
    own = None if p is None else p.default
    if not isinstance(own, str) or own == precision or own not in ("fp32", "bf16"):
        return None
    return (f"--impl {name} runs in its own precision={own!r} (its default; kdadbg passes it nothing), judged "
            f"here at --precision {precision}'s tolerances: for its mode's tolerances use --precision {own}")


class Function(Implementation):
    kind = "function"

    def __init__(self, fn, name: str, precision: str = "fp32"):
        self.fn, self.name, self.precision = fn, name, precision
        self.forward_only = bool(getattr(fn, "forward_only", False))
        self.taps_spec = getattr(fn, "taps_spec", None)
        try:
            params = inspect.signature(fn).parameters
            var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
            self.takes_initial_state = var_kw or ("initial_state" in params and "output_final_state" in params)
        except (TypeError, ValueError):
            self.takes_initial_state = True
        self.precision_note = own_precision_note(fn, name, precision)
        try:    # a function with its own precision parameter (our kernels' op) picks its mode itself
            self.own_precision = "precision" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            self.own_precision = False

    def describe(self) -> dict:
        return {**super().describe(), "function": f"{getattr(self.fn, '__module__', '?')}."
                                                  f"{getattr(self.fn, '__qualname__', repr(self.fn))}"}

    def supports(self, config: KDAConfig, shapes: dict) -> tuple[bool, str]:
        check = getattr(self.fn, "supports", None)
        if check is None:
            return True, ""
        ok, why = check(config, shapes)
        return bool(ok), str(why)

    def run(self, inputs: KDAInputs, config: KDAConfig, *, device: str, taps: TapSelection | None = None) -> ImplRun:
        x = inputs.to(device)
        leaves = {n: getattr(x, n).detach().clone().requires_grad_(not self.forward_only)
                  for n in ("q", "k", "v", "g", "beta")}
        h0 = None
        if x.h0 is not None:
            h0 = x.h0.detach().clone()
        kwargs, vfirst = call_kwargs(self.fn, x, config, h0, self.name)
        if h0 is not None and not vfirst and config.state_layout == "vk":   # the function takes [K,V]
            h0 = h0.transpose(-1, -2).contiguous()
        if h0 is not None:
            leaves["initial_state"] = h0.requires_grad_(not self.forward_only)
            kwargs["initial_state"] = leaves["initial_state"]
        for n in ("A_log", "dt_bias"):
            if n in kwargs and kwargs[n] is not None:
                leaves[n] = kwargs[n].detach().clone().requires_grad_(not self.forward_only)
                kwargs[n] = leaves[n]
        try:
            with torch.enable_grad():
                ret = self.fn(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], **kwargs)
        except KdadbgError as e:   # kdadbg's own error inside the function (a bad TapsSpec): say whose
            if not str(e).startswith(f"--impl {self.name}"):
                e.args = (f"--impl {self.name}: {e}", *e.args[1:])
            raise
        except SystemExit as e:
            raise ImplError(f"--impl {self.name}: called sys.exit({e.code!r}) instead of returning (o, final_state)") \
                from None
        except Exception as e:
            raise ImplError(f"--impl {self.name}: raised {type(e).__name__}: {e}{no_gpu_hint(e, self.name)}",
                            detail=traceback.format_exc()) \
                from None
        o, ht, their_taps = self._unpack(ret)
        flip = config.state_layout == "vk" and not vfirst    # returned states are [K,V]; the dump's are [V,K]
        outputs = {"o": o}
        if ht is not None:
            outputs["ht"] = ht.transpose(-1, -2) if flip else ht
        outputs = checked_outputs(f"--impl {self.name}", {k: v.detach() for k, v in outputs.items()}, inputs, config)
        not_provided = {}
        if ht is None:
            not_provided["ht"] = "the function returned no final state"
        upstream = {}
        grads = self._gradients(o, ht, leaves, x, config, flip, not_provided, upstream)
        outputs.update(checked_outputs(f"--impl {self.name}", grads, inputs, config))
        notes = [self.precision_note] if self.precision_note else []
        if self.precision == "bf16" and not self.own_precision and x.q.dtype in (torch.float32, torch.float64):
            # nothing here is computed in bf16 by kdadbg: say what --precision did, rather than seem to have run bf16
            notes.append(f"--impl {self.name} was given the dump's {str(x.q.dtype).removeprefix('torch.')} tensors "
                         f"as they are; --precision bf16 sets only the tolerances and noise floor it is judged by "
                         f"(a bf16 dump, kdadbg gen --dtype bfloat16, runs it on bf16 inputs)")
        if grads and x.dht is not None and bool(x.dht.ne(0).any()) and (ht is None or ht.grad_fn is None):
            # the upstream gradient of the final state had nowhere to go: every gradient it reaches differs
            notes.append(f"the dump's dht was not applied: --impl {self.name} returned "
                         f"{'no final state' if ht is None else 'a final state outside the autograd graph'}, so "
                         f"its gradients lack dht's part and differ from the reference wherever it reaches; "
                         f"return the final state (output_final_state=True) before looking at the backward")
        run = ImplRun(outputs, not_provided=not_provided, notes=notes, upstream=upstream)
        if their_taps is not None and taps is not None:
            self._add_taps(run, their_taps, inputs, config, taps)
        elif their_taps is not None:  # run asks for none: say so, rather than seem to have checked them
            run.notes.append(f"--impl {self.name} returned taps; run compares outputs and gradients only (diff "
                             f"checks and compares the taps)")
        return run

    def _unpack(self, ret):
        if not isinstance(ret, (tuple, list)) or len(ret) not in (2, 3):
            raise KdadbgError(f"--impl {self.name}: expected (o, final_state) or (o, final_state, taps), found "
                              f"{type(ret).__name__}{'' if not isinstance(ret, (tuple, list)) else f' of {len(ret)}'}")
        o, ht = ret[0], ret[1]
        if not isinstance(o, torch.Tensor):
            raise KdadbgError(f"--impl {self.name}: output 'o': expected a tensor, found {type(o).__name__}")
        if ht is not None and not isinstance(ht, torch.Tensor):
            raise KdadbgError(f"--impl {self.name}: output 'final_state': expected a tensor or None, found "
                              f"{type(ht).__name__}")
        return o, ht, (ret[2] if len(ret) == 3 else None)

    def _gradients(self, o, ht, leaves, x: KDAInputs, config: KDAConfig, flip: bool, not_provided: dict,
                   upstream: dict) -> dict:
        """The gradients by autograd from the dump's ``do``, ``dht``; ``upstream`` gets the 16-bit dtype each
        reached the backward in where that is not the dump's (``ImplRun.upstream``)."""
        names = [GRAD_OF[n] for n in leaves if n not in ("A_log", "dt_bias") or config.gate != "none"]
        if self.forward_only or o.grad_fn is None:
            why = "forward only" if self.forward_only else "o has no autograd graph (forward only)"
            not_provided.update({g: why for g in names})
            return {}
        outs, grads_in = [o], [x.do.to(o.dtype)]
        if o.dtype in STORAGE_DTYPES and x.do.dtype != o.dtype:
            upstream["do"] = o.dtype
        if ht is not None and ht.grad_fn is not None:
            dht = x.dht if x.dht is not None else torch.zeros_like(ht)
            dht = dht.transpose(-1, -2) if (flip and x.dht is not None) else dht
            outs.append(ht)
            grads_in.append(dht.to(ht.dtype))
            if x.dht is not None and ht.dtype in STORAGE_DTYPES and x.dht.dtype != ht.dtype:
                upstream["dht"] = ht.dtype
        wrt = {n: t for n, t in leaves.items() if GRAD_OF[n] in names}
        try:
            got = torch.autograd.grad(outs, list(wrt.values()), grads_in, allow_unused=True)
        except SystemExit as e:
            raise ImplError(f"--impl {self.name}: its backward called sys.exit({e.code!r})") from None
        except Exception as e:
            raise ImplError(f"--impl {self.name}: its backward raised {type(e).__name__}: {e}{no_gpu_hint(e, self.name)}",
                            detail=traceback.format_exc()) from None
        out = {}
        for (n, t), gr in zip(wrt.items(), got):
            name = GRAD_OF[n]
            if gr is None:
                gr = torch.zeros_like(t)   # no path from this input to the outputs: its gradient is 0
            if name == "dh0" and flip:
                gr = gr.transpose(-1, -2)
            if name == "ddt_bias" and x.dt_bias is not None and gr.numel() == x.dt_bias.numel():
                gr = gr.reshape(x.dt_bias.shape)   # passed flat (fla's [HV*K]), compared in the dump's shape
            out[name] = gr.detach()
        return out

    def _add_taps(self, run: ImplRun, their, inputs: KDAInputs, config: KDAConfig, sel: TapSelection) -> None:
        spec = self.taps_spec or TapsSpec()
        if isinstance(their, (tuple, list)) and len(their) == 2 and isinstance(their[1], TapsSpec):
            their, spec = their
        if not isinstance(their, dict):
            raise KdadbgError(f"--impl {self.name}: taps: expected a dict name -> tensor, found {type(their).__name__}")
        B, T, _, K, V = inputs.shape
        H = inputs.HV   # taps are per value head
        ct = chunk_table(B, T, inputs.cu_seqlens, config.chunk_size)
        ids = list(spec.chunks) if spec.chunks is not None else list(range(ct.n_chunks))
        heads = list(spec.heads) if spec.heads is not None else list(range(H))
        # a tensor of the user's own under a name the registry lacks (a debug value, a typo) is said, not compared:
        # refusing it ended the whole diff (a user trial)
        unknown = [n for n in their if n not in REGISTRY]
        if unknown:
            from ..selection import _did_you_mean

            run.notes.append(f"--impl {self.name} returned taps kdadbg does not know, not compared: "
                             + ", ".join(f"{n}{_did_you_mean(n)}" for n in unknown) + " (kdadbg taps --list)")
            their = {n: t for n, t in their.items() if n in REGISTRY}
        check_tap_shapes(f"--impl {self.name}", their, len(ids), len(heads), config.chunk_size, K, V,
                         spec.state_layout)
        lo, hi = sel.chunk_range(ct.n_chunks)
        taps, rows, hs = select_taps(convert_taps({n: t for n, t in their.items() if n in sel.names}, spec), ids,
                                     heads, list(range(lo, hi)), list(sel.head_list(H)))
        run.taps, run.tap_chunks, run.tap_heads = taps, rows, hs
