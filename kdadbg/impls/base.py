"""The implementation under test: one protocol, whatever computes the outputs (our kernels, the
reference, a taps file, fla, FlashKDA, a user's function).

An :class:`Implementation` answers ``supports(config, shapes)`` before any work and ``run(...)`` with
an :class:`ImplRun`: outputs and gradients in the dump's shapes (what it does not provide is absent
and listed in ``not_provided``) and, optionally, taps in the registry's layout and units. Taps in
another convention come with a :class:`TapsSpec` and are converted by :func:`convert_taps`.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field

import torch

from kdadbg_kernels.taps import REGISTRY, TapSelection

from ..config import KDAConfig, KDAInputs
from ..errors import EXIT_NUMERIC, KdadbgError

LN2 = math.log(2.0)
STATE_TAPS = ("S", "dS")
GATE_TAPS = ("gc", "gT")          # log-decay: ×ln2 from log2 units
GATE_GRAD_TAPS = ("dgc", "dgT")   # gradients w.r.t. it: ÷ln2 from log2 units


class ImplError(KdadbgError):
    """The implementation under test raised: one line naming it and the exception, exit 1."""

    exit_code = EXIT_NUMERIC

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail   # the whole traceback, shown with --traceback


@dataclass(frozen=True)
class TapsSpec:
    """Conventions of an implementation's taps, converted to the registry's by :func:`convert_taps`.

    state_layout: ``kv`` (the registry's ``[K,V]``) or ``vk`` (``[V,K]``: transposed); gate_units:
    ``ln`` or ``log2`` (``G2 = Gn / ln2``: ``gc, gT`` times ln2, ``dgc, dgT`` divided by ln2, since
    ``dl/dG2 = ln2 · dl/dGn``); chunks, heads: the global chunk ids and heads of the taps' two leading
    axes (None: every chunk, every head of the call).
    """

    state_layout: str = "kv"
    gate_units: str = "ln"
    chunks: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None

    def __post_init__(self):
        for f in ("state_layout", "gate_units"):   # as the dump's keyword values: any case
            v = getattr(self, f)
            if isinstance(v, str):
                object.__setattr__(self, f, v.strip().lower())
        if self.state_layout not in ("kv", "vk"):
            raise KdadbgError(f"taps state layout: expected kv or vk, found {self.state_layout!r}")
        if self.gate_units not in ("ln", "log2"):
            raise KdadbgError(f"taps gate units: expected ln or log2, found {self.gate_units!r}")


def convert_taps(taps: dict[str, torch.Tensor], spec: TapsSpec) -> dict[str, torch.Tensor]:
    """Taps in ``spec``'s conventions -> the registry's (float64)."""
    out = {}
    for name, t in taps.items():
        t = t.detach().to(torch.float64)
        if spec.state_layout == "vk" and name in STATE_TAPS:
            t = t.transpose(-1, -2)
        if spec.gate_units == "log2" and name in GATE_TAPS:
            t = t * LN2
        if spec.gate_units == "log2" and name in GATE_GRAD_TAPS:
            t = t / LN2
        out[name] = t.contiguous()
    return out


@dataclass
class ImplRun:
    """What one call of an implementation gave.

    outputs: ``o, ht, dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias`` as they apply, in the dump's
        shapes (``ht``/``dh0`` in its state layout); a name absent here is not provided.
    taps: registry name -> ``[len(tap_chunks), len(tap_heads), *per-chunk shape]``, registry layout
        and units, NaN where the implementation wrote nothing; ``tap_heads`` are value heads (GVA).
    not_provided: output name -> why (e.g. ``"forward only"``).
    tap_storage: tap name -> the 16-bit dtype the implementation stores it in (FlashKDA's bf16 ``kd``,
        ``S``, ...): the noise floor of those cells includes that rounding, as it does for outputs
        returned in 16 bits.
    """

    outputs: dict[str, torch.Tensor]
    taps: dict[str, torch.Tensor] = field(default_factory=dict)
    tap_chunks: list[int] = field(default_factory=list)
    tap_heads: list[int] = field(default_factory=list)
    not_provided: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tap_storage: dict[str, torch.dtype] = field(default_factory=dict)   # taps the implementation stores in 16 bits
    # upstream gradient -> the 16-bit dtype the implementation's backward received it in, where that rounded the
    # dump's (autograd hands a bf16 output's gradient in bf16; FlashKDA takes bf16): ``as_received``
    upstream: dict[str, torch.dtype] = field(default_factory=dict)


STORAGE_DTYPES = (torch.bfloat16, torch.float16)
UPSTREAM = ("do", "dht")


def rounded_upstream(inputs: KDAInputs, name: str, dtype: torch.dtype) -> bool:
    """Whether handing the dump's upstream gradient ``name`` to a backward in ``dtype`` (16 bits) changes it."""
    t = getattr(inputs, name)
    if t is None or dtype not in STORAGE_DTYPES or t.dtype == dtype:
        return False
    r = t.to(dtype).to(t.dtype)
    return not bool(((r == t) | (torch.isnan(r) & torch.isnan(t))).all())   # (NaN kept is not a change)


def as_received(inputs: KDAInputs, upstream: dict[str, torch.dtype]) -> KDAInputs | None:
    """The dump's inputs with ``do`` and ``dht`` as the implementation's backward received them (``upstream``:
    rounded to those 16-bit dtypes, kept in their own dtype), or None where that changed nothing. The reference
    and the noise floor then take the same upstream gradient: the rounding happened before the backward under
    test, which is judged on what it was given."""
    import dataclasses

    # kept in float32 (every 16-bit value exactly): rounding back to a 16-bit dump's other dtype would round twice
    changed = {n: getattr(inputs, n).to(dt).to(torch.float32 if getattr(inputs, n).dtype in STORAGE_DTYPES
                                                 else getattr(inputs, n).dtype)
               for n, dt in upstream.items() if n in UPSTREAM and rounded_upstream(inputs, n, dt)}
    return dataclasses.replace(inputs, **changed) if changed else None


def _rounding_said(t: torch.Tensor, dtype: torch.dtype) -> str:
    """How much rounding ``t`` to ``dtype`` changed it: `` (ratio R`` of the rounding alone, fla's metric, and the
    share of its nonzero elements it flushed to 0 where any ``)``."""
    x = t.detach().to(torch.float64)
    r = t.detach().to(dtype).to(torch.float64)
    m = torch.isfinite(x)
    x, r = x[m], r[m]
    if not x.numel():
        return ""
    ratio = float((r - x).pow(2).mean().sqrt() / (x.pow(2).mean().sqrt() + 1e-300))
    nonzero = x != 0
    flushed = float(((r == 0) & nonzero).sum()) / max(1, int(nonzero.sum()))
    return f" (the rounding alone ratio {ratio:.2g}" + (f"; {flushed:.1%} of its nonzero elements flushed to 0"
                                                      if flushed else "") + ")"


def received_note(name: str, inputs: KDAInputs, upstream: dict[str, torch.dtype], windows: bool = False) -> str | None:
    """What ``as_received`` did, for the notes (None where it did nothing). ``windows``: the implementation ran
    on seeded windows, whose ``dht`` seeds (the reference's ``dS``) it received rounded as well, and the
    reference's windows took them so (``localise.window_inputs``)."""
    parts = [f"{n} to {str(dt).removeprefix('torch.')}{_rounding_said(getattr(inputs, n), dt)}"
             for n, dt in upstream.items() if n in UPSTREAM and rounded_upstream(inputs, n, dt)]
    if windows and "dht" in upstream and not any(p.startswith("dht ") for p in parts):
        parts.append(f"the windows' dht seeds to {str(upstream['dht']).removeprefix('torch.')}")
    if not parts:
        return None
    return (f"{name}'s backward received the upstream gradient rounded ({', '.join(parts)}: an output's gradient "
            f"reaches a backward in the output's dtype); the reference and the noise floor take the same rounded "
            f"values, so that rounding, made before the backward under test, is not counted against it")


def stored_as(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``t`` rounded to a 16-bit storage dtype and back (what an implementation that stores it so can
    hold at best); unchanged for any other dtype."""
    return t.to(dtype).to(t.dtype) if dtype in STORAGE_DTYPES else t


def rounding_bound(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``ref`` moved by half a unit in the last place of the 16-bit ``dtype`` (away from zero): an
    implementation storing it so at its worst after one rounding. Against ``ref`` its ratio is the RMS of
    those half-ulps over RMS(ref), 2^-9..2^-8 for bf16 whatever the values, where ``stored_as`` of one
    float32 run gives whatever that run's rounding happened to be (a cell whose norm a few elements carry,
    as ``ki``'s largest ``exp(-gc)`` do, drew floors 10x under the bound). Zeros and non-finite values stay."""
    _, e = torch.frexp(ref)
    nmant = round(-math.log2(torch.finfo(dtype).eps))   # stored mantissa bits: 7 bf16, 10 fp16
    half = torch.ldexp(torch.ones_like(ref), e - 2 - nmant)
    return torch.where(torch.isfinite(ref) & (ref != 0), ref + torch.sign(ref) * half, ref)


class Implementation:
    """Base of every implementation; subclasses set ``name`` and override ``run`` (and ``supports``).

    ``takes_initial_state``: it can run a window of chunks seeded with a state and the gradient of its
    final state (what ``diff`` needs to tell an error made here from one carried in); ``provides_taps``:
    it can write taps; ``precision``: the tolerance table and noise floor it is judged by.
    """

    name: str = "implementation"
    kind: str = "implementation"
    takes_initial_state: bool = True
    provides_taps: bool = False
    precision: str = "fp32"

    def config_for(self, config: KDAConfig) -> tuple[KDAConfig, str | None]:
        """The config this implementation runs and is compared at, and a note when it is not the dump's
        (FlashKDA works in 16-token chunks only). ``run`` and ``diff`` use it for both sides."""
        return config, None

    def supports(self, config: KDAConfig, shapes: dict) -> tuple[bool, str]:
        """``(False, why)`` when this implementation cannot run a dump of this config and these sizes
        (``shapes``: B, T, H (q/k heads), HV (value heads), K, V, N, varlen, dtype, has_h0, has_dht)."""
        return True, ""

    def run(self, inputs: KDAInputs, config: KDAConfig, *, device: str, taps: TapSelection | None = None
            ) -> ImplRun:
        raise NotImplementedError

    def describe(self) -> dict:
        """The JSON ``impl`` object."""
        return {"name": self.name, "kind": self.kind, "precision": self.precision}


def choose_interpreter(device: str, module: str, what: str) -> None:
    """Set ``TRITON_INTERPRET`` for ``device`` before ``module``'s Triton kernels are imported (the
    interpreter is chosen when they decorate): ``cpu`` needs it, ``cuda`` must not have it. ``what``
    names the implementation in the one-line error."""
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if device == "cpu" and not interpret:
        if module in sys.modules:
            raise KdadbgError(f"{what}--device cpu: {module} was already compiled for CUDA in this process; "
                              f"set TRITON_INTERPRET=1 before starting it")
        if "triton.language" in sys.modules:
            # triton.language's own @triton.jit functions (tl.sum, tl.sigmoid, ...) were made for the compiler
            # when it was imported; the interpreter cannot call them inside an interpreted kernel
            raise KdadbgError(f"{what}--device cpu: Triton was imported in this process without "
                              f"TRITON_INTERPRET, so its interpreter cannot run {module} here; set TRITON_INTERPRET=1 "
                              f"before starting it (or before the first import of triton)")
        os.environ["TRITON_INTERPRET"] = "1"
    if device == "cuda" and interpret:
        raise KdadbgError(f"{what}--device cuda: TRITON_INTERPRET is set, so {module} runs only on the CPU; "
                          f"unset it or use --device cpu")


def shapes_of(inputs: KDAInputs) -> dict:
    """What ``supports`` gets to judge a dump by."""
    B, T, H, K, V = inputs.shape
    return {"B": B, "T": T, "H": H, "HV": inputs.HV, "K": K, "V": V, "N": inputs.n_seqs,
            "varlen": inputs.cu_seqlens is not None,
            "dtype": str(inputs.q.dtype).removeprefix("torch."), "has_h0": inputs.h0 is not None,
            "has_dht": inputs.dht is not None}


def check_supported(impl: Implementation, inputs: KDAInputs, config: KDAConfig, where: str = "",
                    device: str | None = None) -> None:
    """Refuse an unsupported dump before any work: one line, exit 2. ``device`` given, an implementation's
    ``check_device(inputs, device)`` (where it has one) refuses what it cannot run there, before any
    progress line too (fla's 16-bit path on the CPU: a user trial)."""
    ok, why = impl.supports(config, shapes_of(inputs))
    if not ok:
        raise KdadbgError(f"{where + ': ' if where else ''}--impl {impl.name}: cannot run this dump: {why}")
    on_device = getattr(impl, "check_device", None)
    if device is not None and on_device is not None:
        on_device(inputs, device)
    check = getattr(impl, "check_inputs", None)   # a file of results: made from these inputs?
    if check is not None:
        check(inputs, config)


def select_taps(taps: dict[str, torch.Tensor], have_chunks: list[int], have_heads: list[int],
                want_chunks: list[int], want_heads: list[int]) -> tuple[dict, list[int], list[int]]:
    """The taps' rows and heads in ``want_*`` that the implementation wrote: ``(taps, chunks, heads)``."""
    rows = [c for c in want_chunks if c in have_chunks]
    heads = [h for h in want_heads if h in have_heads]
    if not rows or not heads:
        return {}, rows, heads
    out = {}
    for n, t in taps.items():
        ri = torch.tensor([have_chunks.index(c) for c in rows], dtype=torch.long, device=t.device)
        hi = torch.tensor([have_heads.index(h) for h in heads], dtype=torch.long, device=t.device)
        out[n] = t.index_select(0, ri).index_select(1, hi)
    return out, rows, heads


def check_tap_shapes(where: str, taps: dict[str, torch.Tensor], n_rows: int, n_heads: int, C: int, K: int, V: int,
                     state_layout: str = "kv") -> None:
    """Taps must be ``[n_rows, n_heads, *per-chunk shape]`` (states ``[V,K]`` in the ``vk`` layout)."""
    for n, t in taps.items():
        if n not in REGISTRY:
            raise KdadbgError(f"{where}: tap {n!r}: not a registry tap (kdadbg taps --list)")
        shape = REGISTRY[n].dims(C, K, V)
        if state_layout == "vk" and n in STATE_TAPS:
            shape = shape[::-1]
        want = (n_rows, n_heads, *shape)
        if tuple(t.shape) != want:
            raise KdadbgError(f"{where}: tap {n!r}: expected shape [{','.join(map(str, want))}] (chunks, heads, "
                              f"per-chunk), found [{','.join(map(str, t.shape))}]")
