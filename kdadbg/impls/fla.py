"""``--impl fla``: fla-core 0.6.0's ``fla.ops.kda.chunk_kda`` on its Triton path, with its own
intermediates as taps (README, "fla as an implementation").

Install the optional extra: ``pip install -e '.[fla]'`` in a kdadbg checkout (``fla-core==0.6.0``; it also needs
``einops``, which fla-core does not declare). The adapter pins that version because the taps read
fla's stage functions, whose names and return tuples are internals.

Outputs and gradients: fla's public ``chunk_kda`` through autograd (:class:`~.function.Function`),
with every backend dispatch bypassed: the undecorated ``chunk_kda`` is called and ``FLA_FLASH_KDA=0``
/ ``FLA_TILELANG=0`` are set for the call, so a FlashKDA or TileLang build never takes over a stage.
``safe_gate=True`` with the lower-bound gate (what Kimi-style layers use; fla takes it for bounds in
``[-5, 0)``), off otherwise; ``dt_bias`` goes as fla's flat ``[H*K]``; a dump without ``h0`` runs
with a zero ``initial_state`` so fla computes ``dh0`` (the ``dS`` of each sequence's first chunk).

Taps: the same call, with fla's stage functions wrapped while it runs (:func:`recording`), so the
taps are the very tensors the outputs were computed from; :func:`to_taps` converts them to the
registry (log2 -> ln gates, ``[V,K]`` -> ``[K,V]`` states, per-token tensors gathered into chunks
in the registry's order, ``dh`` shifted by one chunk, ``dAqk`` divided by the scale).

On the CPU fla's kernels run under the Triton interpreter with two shims (:func:`interpreter_shims`):
autotuning takes each kernel's first config (the interpreter cannot time); a kernel's plain ``range``
loop yields Triton int32 scalars as compiled code does (fla calls ``i_t.to(tl.int64)``); fla's
import-time alias of ``tl.gather`` is pointed at the interpreter's; and the safe-gate backward's
``bf16x3`` dot precision, which the interpreter refuses, reads ``ieee`` (the interpreter's dots are
numpy float32 whatever they are told). 16-bit inputs are refused on the CPU: the interpreter (Triton
3.9) gets ``bf16_tensor - tl.dot(bf16, bf16)`` wrong, which fla's recurrence computes. fla's warning
that Triton "is not supported on current platform" (it finds no GPU driver, which is the point of the
interpreter) is silenced around its import and calls (:func:`quiet_cpu_warning`), and nothing else.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import warnings
from dataclasses import dataclass, field

import torch

from kdadbg_kernels.taps import TapSelection

from ..chunks import ChunkTable, chunk_table
from ..config import KDAConfig, KDAInputs
from ..errors import KdadbgError
from .base import LN2, Implementation, ImplRun, choose_interpreter, select_taps
from .function import Function

FLA_VERSION = "0.6.0"
CHUNK_SIZES = (32, 64)
MAX_K = 256
INSTALL = "pip install fla-core==0.6.0 einops (in a kdadbg checkout: pip install -e '.[fla]')"
TRITON_PATH_ENV = {"FLA_FLASH_KDA": "0", "FLA_TILELANG": "0"}
FLA_TAPS = ("gc", "gT", "b", "qd", "kr", "INV", "Mqk", "S", "U", "dS", "dU", "dMqk", "dL", "db")

# stage function wrapped -> what its result (or keyword arguments) hold, by fla's names
FWD_STAGES = ("kda_gate_chunk_cumsum", "chunk_local_cumsum", "chunk_kda_fwd_intra", "chunk_gated_delta_rule_fwd_h")
BWD_STAGES = ("recompute_w_u_fwd", "chunk_kda_bwd_dAv", "chunk_gated_delta_rule_bwd_dhu", "chunk_kda_bwd_wy_dqkg_fused",
              "chunk_kda_bwd_intra")


CPU_WARNING = "Triton is not supported on current platform"   # fla.utils.hardware._cpu_device_warning


@contextlib.contextmanager
def quiet_cpu_warning():
    """fla's ``UserWarning: Triton is not supported on current platform, roll back to CPU.``, given on
    every CPU run (where the interpreter is what runs), silenced; every other warning still shows."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=CPU_WARNING, category=UserWarning)
        yield


def installed_version() -> str | None:
    """fla-core's version as installed, without importing it (None: not installed)."""
    if importlib.util.find_spec("fla") is None:
        return None
    try:
        return importlib.metadata.version("fla-core")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _first_config_prune(orig):
    def prune(self, *args, **kwargs):
        return orig(self, *args, **kwargs)[:1]
    prune._kdadbg_shim = True
    return prune


def _scalar_range(*args):
    """``range`` for fla's kernels under the interpreter: int32 Triton scalars, as the compiler types them."""
    import builtins

    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    bounds = [int(np.asarray(a.handle.data).reshape(-1)[0]) if hasattr(a, "handle") else int(a) for a in args]
    for i in builtins.range(*bounds):
        yield tl.core.tensor(TensorHandle(np.array(i, dtype=np.int32), tl.int32), tl.int32)


KERNEL_MODULES = ("fla.ops.common.chunk_delta_h", "fla.ops.kda.chunk_intra", "fla.ops.kda.chunk_bwd",
                  "fla.ops.kda.wy_fast", "fla.ops.gla.chunk", "fla.ops.kda.gate", "fla.ops.utils.cumsum",
                  "fla.ops.kda.chunk_intra_token_parallel", "fla.modules.norm.l2norm", "fla.ops.common.gate")


def _gather(src, index, axis):
    import triton.language as tl

    return tl.gather(src, index, axis)   # looked up when called: the interpreter's tl.gather


def interpreter_shims() -> None:
    """Let fla's kernels run under the Triton interpreter (CPU); idempotent."""
    import triton.language as tl
    from triton.runtime.autotuner import Autotuner

    if not getattr(Autotuner.prune_configs, "_kdadbg_shim", False):
        Autotuner.prune_configs = _first_config_prune(Autotuner.prune_configs)
    for name in KERNEL_MODULES:
        with contextlib.suppress(ImportError):
            module = importlib.import_module(name)
            module.range = _scalar_range
            if hasattr(module, "gather"):   # bound to tl.gather at import, before the interpreter patches it
                module.gather = _gather
            if hasattr(module, "SAFE_GATE_DOT_PRECISION"):   # the interpreter knows no bf16x3; its dots are fp32
                module.SAFE_GATE_DOT_PRECISION = tl.constexpr("ieee")


def load_fla(device: str):
    """Import fla for ``device`` (``cpu``: the interpreter, set before fla's kernels are decorated)."""
    version = installed_version()
    if version is None:
        raise KdadbgError(f"--impl fla: fla is not installed; {INSTALL}")
    if version != FLA_VERSION:
        raise KdadbgError(f"--impl fla: expected fla-core {FLA_VERSION} (the adapter reads its stage functions), "
                          f"found {version}")
    choose_interpreter(device, "fla.ops.kda", "--impl fla ")
    try:
        with quiet_cpu_warning():
            import fla.ops.kda.chunk as chunk
            import fla.ops.kda.chunk_bwd as chunk_bwd
            import fla.ops.kda.chunk_fwd as chunk_fwd
    except ImportError as e:
        raise KdadbgError(f"--impl fla: cannot import fla.ops.kda: {e}; {INSTALL}") from None
    missing = [f"{m.__name__}.{n}" for m, names in ((chunk_fwd, FWD_STAGES), (chunk_bwd, BWD_STAGES)) for n in names
               if not callable(getattr(m, n, None))]
    if missing:
        raise KdadbgError(f"--impl fla: fla-core {version} lacks the stage functions {', '.join(missing)}; "
                          f"expected fla-core {FLA_VERSION}")
    if device == "cpu":
        with quiet_cpu_warning():   # the shims import fla's kernel modules
            interpreter_shims()
    elif os.environ.get("KDADBG_FLA_FIRST_CONFIG", "0") not in ("", "0"):
        first_config_only()
    return chunk, chunk_fwd, chunk_bwd


def first_config_only() -> None:
    """``KDADBG_FLA_FIRST_CONFIG=1``: each fla kernel takes its first autotune config instead of
    minutes of autotuning per new shape (numerics are judged, not timed); idempotent."""
    from triton.runtime.autotuner import Autotuner

    if not getattr(Autotuner.prune_configs, "_kdadbg_shim", False):
        Autotuner.prune_configs = _first_config_prune(Autotuner.prune_configs)


@contextlib.contextmanager
def triton_path():
    """fla's backend switches off for the call (``FLA_FLASH_KDA=0``, ``FLA_TILELANG=0``), restored after."""
    old = {k: os.environ.get(k) for k in TRITON_PATH_ENV}
    os.environ.update(TRITON_PATH_ENV)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class Recorded:
    """fla's intermediates of one call, by fla's names (the first call of each stage)."""

    fwd: dict[str, torch.Tensor] = field(default_factory=dict)
    bwd: dict[str, torch.Tensor] = field(default_factory=dict)


def _keep(store: dict, **tensors) -> None:
    for name, t in tensors.items():
        if name not in store and t is not None:
            store[name] = t.detach().clone()


def _recorder(stage: str, fn, rec: Recorded):
    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        if stage in ("kda_gate_chunk_cumsum", "chunk_local_cumsum"):
            if not kwargs.get("reverse", False):
                _keep(rec.fwd, g=out)
        elif stage == "chunk_kda_fwd_intra":
            w, u, qg, kg, Aqk, Akk = out
            _keep(rec.fwd, beta=kwargs["beta"], kg=kg, Aqk=Aqk, Akk=Akk)
        elif stage == "chunk_gated_delta_rule_fwd_h":
            h, v_new, _ = out
            _keep(rec.fwd, h=h, v_new=v_new)
        elif stage == "recompute_w_u_fwd":
            _keep(rec.bwd, qg=out[2])
        elif stage == "chunk_kda_bwd_dAv":
            _keep(rec.bwd, dAqk=out[0])
        elif stage == "chunk_gated_delta_rule_bwd_dhu":
            dh, dh0, dv = out
            _keep(rec.bwd, dh=dh, dh0=dh0, dv=dv)
        elif stage == "chunk_kda_bwd_wy_dqkg_fused":
            _keep(rec.bwd, dAkk=out[5])
        elif stage == "chunk_kda_bwd_intra":
            _keep(rec.bwd, db=out[2])
        return out
    return wrapped


@contextlib.contextmanager
def recording(rec: Recorded | None, chunk_fwd, chunk_bwd):
    """Wrap fla's stage functions (as its orchestrators look them up) to keep their results in ``rec``."""
    if rec is None:
        yield
        return
    saved = []
    for mod, names in ((chunk_fwd, FWD_STAGES), (chunk_bwd, BWD_STAGES)):
        for n in names:
            saved.append((mod, n, getattr(mod, n)))
            setattr(mod, n, _recorder(n, getattr(mod, n), rec))
    try:
        yield
    finally:
        for mod, n, fn in saved:
            setattr(mod, n, fn)


# conversions: fla's conventions -> the registry's


def tokens_to_chunks(x: torch.Tensor, ct: ChunkTable) -> torch.Tensor:
    """Per-token ``[B, T, H, *rest]`` -> ``[n_chunks, H, C, *rest]`` in the registry's chunk order
    (batch rows, or ``cu_seqlens`` segments on the packed axis), padding rows 0."""
    B, T, H = x.shape[:3]
    flat = x.reshape(B * T, H, *x.shape[3:])
    idx, valid = ct.token_index()
    out = flat[idx.reshape(-1).to(x.device)].reshape(*idx.shape, H, *x.shape[3:])   # [n, C, H, *rest]
    keep = valid.to(x.device).reshape(*valid.shape, *([1] * (out.ndim - 2)))
    # where, not a product: a padding row's source may be memory fla never wrote (NaN * 0 is NaN)
    out = torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out.movedim(2, 1).contiguous()


def gate_ln(g2: torch.Tensor) -> torch.Tensor:
    """fla's cumulative gate in log2 units -> natural log (``G2 = Gn / ln2``)."""
    return g2.to(torch.float64) * LN2


def last_row(x: torch.Tensor, ct: ChunkTable) -> torch.Tensor:
    """``[n, H, C, K]`` -> ``[n, H, K]`` at each chunk's last valid row (``gT`` from ``gc``)."""
    i = (ct.length - 1).to(x.device)
    return x[torch.arange(x.shape[0], device=x.device), :, i]


def chunk_matrix(A: torch.Tensor, ct: ChunkTable, diagonal: int = 0) -> torch.Tensor:
    """fla's per-token ``[B, T, H, BT]`` rows of a chunk's ``[BT, BT]`` matrix -> ``[n, H, C, C]``, its
    lower triangle from ``diagonal`` down (what fla's consumers read; fla leaves the rest unwritten),
    padding rows and columns 0."""
    M = tokens_to_chunks(A, ct).to(torch.float64)
    C = M.shape[-1]
    keep = torch.ones(C, C, dtype=torch.bool, device=M.device).tril(diagonal)
    cols = torch.arange(C, device=M.device)[None, :] < ct.length.to(M.device)[:, None]   # [n, C]
    return torch.where(keep & cols[:, None, None, :], M, torch.zeros((), dtype=M.dtype, device=M.device))


def per_chunk_states(h: torch.Tensor, state_v_first: bool) -> torch.Tensor:
    """fla's ``h``/``dh`` ``[B, NT, H, K, V]`` (``[.., V, K]`` when ``state_v_first``) -> ``[n, H, K, V]``.
    fla's chunk index within the tensor is the registry's: ``n*NT + t`` batched, or the sum of earlier
    segments' chunk counts plus ``t`` under varlen (``B = 1``)."""
    h = h.reshape(-1, *h.shape[2:]).to(torch.float64)
    return (h.transpose(-1, -2) if state_v_first else h).contiguous()


def state_grads(dh: torch.Tensor, dh0: torch.Tensor, ct: ChunkTable, state_v_first: bool) -> torch.Tensor:
    """Registry ``dS[c]`` (w.r.t. the state entering chunk ``c``) from fla's ``dh`` and ``dh0``.

    fla stores ``dh[c]`` before chunk ``c`` adds its own terms: the gradient w.r.t. the state leaving
    ``c``, i.e. the registry's ``dS[c+1]``. So ``dS[c] = dh[c-1]`` inside a sequence and
    ``dS[first chunk of n] = dh0[n]``."""
    dh = per_chunk_states(dh, state_v_first)
    d0 = dh0.to(torch.float64)
    d0 = (d0.transpose(-1, -2) if state_v_first else d0)
    out = torch.empty_like(dh)
    first = (ct.t == 0).to(dh.device)
    prev = torch.arange(ct.n_chunks, device=dh.device) - 1
    out[~first] = dh[prev[~first]]
    out[first] = d0.to(dh.device)[ct.seq.to(dh.device)[first]]
    return out


def to_taps(rec: Recorded, ct: ChunkTable, scale: float, state_v_first: bool, names) -> dict[str, torch.Tensor]:
    """Registry taps ``[n_chunks, H, *shape]`` (float64) from fla's recorded intermediates."""
    f, b = rec.fwd, rec.bwd
    taps = {}

    def want(n, *need):
        return n in names and all(k in f or k in b for k in need)

    if want("gc", "g") or want("gT", "g"):
        gc = tokens_to_chunks(gate_ln(f["g"]), ct)
        if "gc" in names:
            taps["gc"] = gc
        if "gT" in names:
            taps["gT"] = last_row(gc, ct)
    if want("b", "beta"):
        taps["b"] = tokens_to_chunks(f["beta"].to(torch.float64), ct)
    if want("kr", "kg"):
        taps["kr"] = tokens_to_chunks(f["kg"].to(torch.float64), ct)
    if want("qd", "qg"):
        taps["qd"] = tokens_to_chunks(b["qg"].to(torch.float64) * scale, ct)
    if want("INV", "Akk"):
        taps["INV"] = chunk_matrix(f["Akk"], ct)
    if want("Mqk", "Aqk"):
        taps["Mqk"] = chunk_matrix(f["Aqk"], ct)
    if want("S", "h"):
        taps["S"] = per_chunk_states(f["h"], state_v_first)
    if want("U", "v_new"):
        taps["U"] = tokens_to_chunks(f["v_new"].to(torch.float64), ct)
    if want("dS", "dh", "dh0"):
        taps["dS"] = state_grads(b["dh"], b["dh0"], ct, state_v_first)
    if want("dU", "dv"):
        taps["dU"] = tokens_to_chunks(b["dv"].to(torch.float64), ct)
    if want("dMqk", "dAqk"):
        taps["dMqk"] = chunk_matrix(b["dAqk"], ct) / scale
    if want("dL", "dAkk"):
        taps["dL"] = chunk_matrix(b["dAkk"], ct, diagonal=-1)
    if want("db", "db"):
        taps["db"] = tokens_to_chunks(b["db"].to(torch.float64), ct)
    return taps


# fla's kernels under the Triton interpreter (no GPU), forward + backward through autograd: measured on this
# project's 2-core CPU with fla-core 0.6.0, float32 fla_layer dumps at chunk 64 (round 40): T 256 / 512, H 2,
# K = V = 128: 29.0 / 54.4 s; T 256, K = V = 64, H 2 / 4: 18.6 / 38.1 s. Per chunk x head A + B K V / 128^2.
FLA_INTERP_FIXED_S = 3.6
FLA_INTERP_A_S = 2.0
FLA_INTERP_B_S = 1.4


def interpreter_estimate(inputs: KDAInputs, config: KDAConfig, n_chunks: int | None = None) -> tuple[float, str]:
    """``(seconds, how)``: fla's forward + backward under the Triton interpreter on ``n_chunks`` chunks (None:
    all of the dump's at its chunk size) and every value head, by the rate measured above."""
    from ..chunks import chunk_table

    B, T, _, K, V = inputs.shape
    H = inputs.HV
    if n_chunks is None:
        n_chunks = chunk_table(B, T, inputs.cu_seqlens, config.chunk_size).n_chunks
    per = FLA_INTERP_A_S + FLA_INTERP_B_S * K * V / (128 * 128)
    return (FLA_INTERP_FIXED_S + n_chunks * H * per,
            f"{n_chunks} chunks x {H} heads at {per:.2f} s each, fla's rate measured on a 2-core CPU")


class Fla(Implementation):
    """fla-core 0.6.0's ``chunk_kda`` (Triton path). ``safe_gate``: None picks fla's safe gate for the
    lower-bound gate when its bound is in ``[-5, 0)``; True or False forces it."""

    kind = "fla"
    provides_taps = True

    def __init__(self, precision: str = "bf16", safe_gate: bool | None = None):
        self.precision, self.safe_gate, self.name = precision, safe_gate, "fla"

    def describe(self) -> dict:
        return {**super().describe(), "version": installed_version(), "path": "triton (backend dispatch bypassed)",
                "safe_gate": "auto" if self.safe_gate is None else self.safe_gate}

    def use_safe_gate(self, config: KDAConfig) -> bool:
        if self.safe_gate is not None:
            return self.safe_gate
        return config.gate == "lower_bound" and -5 <= config.lower_bound < 0

    def supports(self, config: KDAConfig, shapes: dict) -> tuple[bool, str]:
        version = installed_version()
        if version is None:
            return False, f"fla is not installed; {INSTALL}"
        if version != FLA_VERSION:
            return False, f"expected fla-core {FLA_VERSION} (the adapter reads its stage functions), found {version}"
        if config.chunk_size not in CHUNK_SIZES:
            return False, f"fla's chunk_kda takes chunk_size 32 or 64, the dump has {config.chunk_size} " \
                          f"(run with --chunk-size 64 or 32)"
        if shapes["K"] > MAX_K:
            return False, f"fla's chunk_kda takes K <= {MAX_K}, found K={shapes['K']}"
        if self.use_safe_gate(config) and config.gate == "lower_bound" and not -5 <= config.lower_bound < 0:
            return False, f"fla's safe_gate takes lower_bound in [-5, 0), found {config.lower_bound}"
        return True, ""

    def check_device(self, inputs: KDAInputs, device: str) -> None:
        """fla's 16-bit path is refused on the CPU (below); ``check_supported`` asks before any work."""
        if device == "cpu" and inputs.q.dtype in (torch.bfloat16, torch.float16):
            raise KdadbgError(f"--impl fla --device cpu: {str(inputs.q.dtype).removeprefix('torch.')} inputs: the "
                              f"Triton interpreter computes a 16-bit tensor minus a float32 dot wrongly (values ~1e10 "
                              f"in fla's v_new), so fla's 16-bit path runs only on --device cuda; on the CPU give it "
                              f"a float32 dump (kdadbg gen ... --dtype float32, or save your tensors in float32)")

    def run(self, inputs: KDAInputs, config: KDAConfig, *, device: str, taps: TapSelection | None = None) -> ImplRun:
        self.check_device(inputs, device)
        chunk, chunk_fwd, chunk_bwd = load_fla(device)
        notes = []
        if inputs.q.dtype == torch.float64:
            inputs = inputs.to(dtype=torch.float32)
            notes.append("float64 inputs run in float32 (fla's kernels take float32, bfloat16 and float16)")
        safe = self.use_safe_gate(config)
        raw = inspect.unwrap(chunk.chunk_kda)   # the Triton path itself, not the backend dispatcher
        # the states and every tap are per value head (HV; GVA when HV > H: fla reads q/k head hv // (HV/H))
        N, H, K, V = inputs.n_seqs, inputs.HV, inputs.shape[3], inputs.shape[4]

        def chunk_kda(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens, chunk_size,
                      use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, lower_bound, A_log,
                      dt_bias, state_v_first):
            if initial_state is None:   # a zero state, so that fla computes dh0 (dS of first chunks)
                shape = (N, H, V, K) if state_v_first else (N, H, K, V)
                initial_state = torch.zeros(shape, dtype=torch.float32, device=q.device)
            return raw(q, k, v, g, beta, scale=scale, initial_state=initial_state.to(torch.float32),
                       output_final_state=output_final_state,
                       cu_seqlens=None if cu_seqlens is None else cu_seqlens.to(torch.long),
                       cu_seqlens_cpu=None if cu_seqlens is None else cu_seqlens.to("cpu", torch.long),
                       chunk_size=chunk_size, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                       use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                       safe_gate=safe, lower_bound=lower_bound, A_log=A_log,
                       dt_bias=None if dt_bias is None else dt_bias.reshape(-1), state_v_first=state_v_first)

        rec = Recorded() if taps is not None else None
        with triton_path(), recording(rec, chunk_fwd, chunk_bwd), quiet_cpu_warning():
            run = Function(chunk_kda, self.name, self.precision).run(inputs, config, device=device)
        run.notes.extend(notes)
        if safe:
            run.notes.append(f"fla safe_gate=True (lower_bound={config.lower_bound})")
        if rec is not None:
            B, T = inputs.shape[:2]
            ct = chunk_table(B, T, inputs.cu_seqlens, config.chunk_size)
            names = [n for n in taps.names if n in FLA_TAPS]
            all_taps = to_taps(rec, ct, config.scale, config.state_layout == "vk", names)
            lo, hi = taps.chunk_range(ct.n_chunks)
            run.taps, run.tap_chunks, run.tap_heads = select_taps(
                all_taps, list(range(ct.n_chunks)), list(range(H)), list(range(lo, hi)), list(taps.head_list(H)))
        if device == "cuda":
            torch.cuda.synchronize()
        return run
