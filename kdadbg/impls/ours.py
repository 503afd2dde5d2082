"""``--impl ours``: our Triton kernels (``kernels/``), forward + backward with taps written by the kernels.

Without a GPU the kernels run under the Triton interpreter on CPU tensors. The interpreter is
chosen when ``@triton.jit`` decorates, i.e. when the kernel modules are first imported, so
:func:`kernels_module` sets ``TRITON_INTERPRET=1`` before that import when the device is the CPU.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import numpy as np
import torch

from kdadbg_kernels.taps import TapSelection
from kdadbg_kernels.tuning import KnobError

from .. import memory
from ..config import KDAConfig, KDAInputs
from ..dump import check_kernel_dims, kernel_inputs
from ..errors import KdadbgError
from .base import Implementation, ImplRun, choose_interpreter

PRECISIONS = ("fp32", "bf16")


def kernels_module(device: str):
    """Import ``kdadbg_kernels.chunk`` for ``device`` (``cpu``: interpreter; ``cuda``: compiled)."""
    choose_interpreter(device, "kdadbg_kernels.chunk", "")
    if device == "cpu":
        from ..interpreter import skip_repeated_patching

        skip_repeated_patching()
    from kdadbg_kernels import chunk

    return chunk


def check_tap_memory(inputs: KDAInputs, config: KDAConfig, sel: TapSelection, device: str,
                     headroom: float = 0.5) -> int:
    """Refuse, before any work, a tap selection whose float32 buffers would take more than
    ``headroom`` of the free memory; returns the bytes it needs."""
    from ..chunks import chunk_table

    B, T, _, K, V = inputs.shape
    H = inputs.HV   # taps are per value head
    n_chunks = chunk_table(B, T, inputs.cu_seqlens, config.chunk_size).n_chunks
    need = sel.nbytes(n_chunks, H, config.chunk_size, K, V)
    free = memory.free_bytes(device)
    if need > headroom * free:
        lo, hi = sel.chunk_range(n_chunks)
        raise KdadbgError(
            f"taps: {len(sel.names)} taps x {hi - lo} chunks x {len(sel.head_list(H))} heads need "
            f"{need / 2**30:.1f} GiB of float32 buffers, more than half of the {free / 2**30:.1f} GiB free "
            f"on {device}; narrow the selection with --taps (e.g. S,dS), --chunks A:B or --heads i,j")
    return need


@contextmanager
def _knob_errors():
    """A ``KDADBG_*`` knob our kernels refuse (``kernels/tuning.py``'s ``KnobError``) as bad input: one line."""
    try:
        yield
    except KnobError as e:
        raise KdadbgError(f"{e} (a kernel knob from the environment; kernels/tuning.py lists them)") from None


def run_kernels(inputs: KDAInputs, config: KDAConfig, precision: str = "fp32", device: str = "cpu",
                taps: TapSelection | None = None):
    """Forward and backward of our kernels: ``(outputs, tap buffers, TapPlan | None)``.

    float64 inputs run cast to float32 (``kdadbg.dump.kernel_inputs``). Outputs and gradients are
    float32 in the dump's shapes (``ht``/``dh0`` in its state layout; GVA: dq, dk per q/k head);
    tap buffers are ``[n_sel_chunks, n_sel_value_heads, *shape]``, NaN where nothing was written.
    """
    if precision not in PRECISIONS:
        raise KdadbgError(f"--precision: expected one of {', '.join(PRECISIONS)}, found {precision!r}")
    if taps is not None:
        check_tap_memory(inputs, config, taps, device)
    chunk = kernels_module(device)
    x = kernel_inputs(inputs).to(device)
    # the interpreter emulates float32 in NumPy: an Inf/NaN there (gates past the kernels' limit) is what a GPU
    # gives silently, and run/diff report it; NumPy would warn of it, from its own files (np.sum's reduce)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore") if device == "cpu" else nullcontext(), \
            _knob_errors():
        outputs, buffers, plan = chunk.kda_forward_backward(
            x.q, x.k, x.v, x.g, x.beta, x.do, dht=x.dht, h0=x.h0, cu_seqlens=x.cu_seqlens,
            cu_seqlens_cpu=inputs.cu_seqlens.cpu() if inputs.cu_seqlens is not None else None, A_log=x.A_log,
            dt_bias=x.dt_bias, scale=config.scale, chunk_size=config.chunk_size, gate=config.gate,
            lower_bound=config.lower_bound, qk_l2norm=config.qk_l2norm, beta_sigmoid=config.beta_sigmoid,
            state_layout=config.state_layout, precision=precision, taps=taps)
    if device == "cuda":
        torch.cuda.synchronize()
    return outputs, buffers, plan


class Ours(Implementation):
    """Our kernels at ``precision`` (``fp32``: IEEE dot operands, the debugging mode; ``bf16``: bf16
    operands with fp32 accumulation, as in training). Float64 dumps run in float32 (said in a note)."""

    kind = "ours"
    provides_taps = True

    def __init__(self, precision: str = "fp32"):
        if precision not in PRECISIONS:
            raise KdadbgError(f"--precision: expected one of {', '.join(PRECISIONS)}, found {precision!r}")
        self.precision = precision
        self.name = "ours"

    def supports(self, config: KDAConfig, shapes: dict) -> tuple[bool, str]:
        try:
            check_kernel_dims("dump", shapes["K"], shapes["V"])
        except KdadbgError as e:
            return False, str(e).removeprefix("dump: ")
        return True, ""

    def run(self, inputs: KDAInputs, config: KDAConfig, *, device: str, taps: TapSelection | None = None) -> ImplRun:
        notes = []
        if inputs.q.dtype == torch.float64:   # run_kernels casts (kdadbg.dump.kernel_inputs)
            wide = [n for n in inputs.TENSORS if getattr(inputs, n) is not None and getattr(inputs, n).dtype == torch.float64]
            notes.append(f"float64 inputs ({', '.join(wide)}) run cast to float32 (our kernels take float32, bfloat16 "
                         f"and float16); the reference uses the float64 values")
        outputs, buffers, _ = run_kernels(inputs, config, self.precision, device, taps=taps)
        if taps is None:
            return ImplRun(outputs, notes=notes)
        B, T = inputs.shape[:2]
        from ..chunks import chunk_table

        lo, hi = taps.chunk_range(chunk_table(B, T, inputs.cu_seqlens, config.chunk_size).n_chunks)
        return ImplRun(outputs, buffers, list(range(lo, hi)), list(taps.head_list(inputs.HV)), notes=notes)


# Our kernels under the Triton interpreter (with kdadbg.interpreter's skip): a fixed start plus, per chunk x
# value head, a + b K/128 + c C/64 + d K V C / (128^2 64) seconds, with (a, b, c, d) per precision: bf16 mode
# emulates its bf16 operands under the interpreter (tlmath.mm rounds each operand in fp32), 1.4-2x fp32's
# time. Fitted to forward+backward runs on this project's 2-core CPU (K, V 16..128, chunks 16/32/64, 2-64
# chunks x heads; docs/cpu/interpreter_rate.log), then raised 25 %: a bound more than a mean (runs of 8 or
# more chunks x heads took 0.65-0.96 of it), so that --max-interpreter-s lets no run far over its limit through.
INTERP_FIXED_S = 1.5
INTERP_RATES = {"fp32": (0.04, 0.34, 0.13, 0.30), "bf16": (0.03, 0.58, 0.28, 0.62)}


def interpreter_estimate(inputs: KDAInputs, config: KDAConfig, n_chunks: int | None = None,
                         precision: str = "fp32") -> tuple[float, str]:
    """``(seconds, how)``: the estimated time of our kernels' forward+backward at ``precision`` under the
    interpreter on ``n_chunks`` chunks (None: all of the dump's) and every head."""
    from ..chunks import chunk_table

    if precision not in INTERP_RATES:
        raise KdadbgError(f"--precision: expected one of {', '.join(PRECISIONS)}, found {precision!r}")
    B, T, _, K, V = inputs.shape
    H, C = inputs.HV, config.chunk_size   # the kernels run over the value heads (GVA repeats q, k)
    if n_chunks is None:
        n_chunks = chunk_table(B, T, inputs.cu_seqlens, C).n_chunks
    a, b, c, d = INTERP_RATES[precision]
    per = a + b * K / 128 + c * C / 64 + d * K * V * C / (128 * 128 * 64)
    est = INTERP_FIXED_S + n_chunks * H * per
    return est, (f"{n_chunks} chunks x {H} heads at {per:.2f} s each in {precision} mode, the rate measured on a "
                 f"2-core CPU")
