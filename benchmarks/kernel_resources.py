"""Registers, spills and shared memory of every kernel launch, compiled for the H100/H200 (sm_90)
on a machine with no GPU.

    python benchmarks/kernel_resources.py [--H 16] [--K 128] [--V 128] [--chunk-size 64]
                                          [--precision bf16] [--taps [NAME ...]] [--op | --infer]
                                          [--setting pregated|softplus|lower_bound] [--sass]

Runs one forward+backward on small CPU tensors with the launches intercepted: each launch is
compiled by Triton for ``cuda:90`` with the launch's own constexprs and options, and
``cuobjdump --dump-resource-usage`` (shipped with Triton) reads the cubin; ``SMEM`` is the shared memory
the launch needs (``OVER``: more than an H200 grants one program, so the launch would fail). ``STACK`` > 0 means
local-memory spills, which cost most in the sequential chunk loops. ``--sass`` adds each kernel's sm_90
instruction count (``cuobjdump -sass``, static: a loop's body counts once).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch

import kdadbg_kernels.tuning as _tuning

# an older copy of kernels/ (KERNELS_DIR A/B runs) may predate the constant: it is the H200's
SMEM_SM90 = getattr(_tuning, "SMEM_SM90", 232448)

DTYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.int32: "*i32",
          torch.int64: "*i64"}
OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion", "num_ctas", "maxnreg")


def _signature(fn: JITFunction, args, kwargs):
    bound = dict(zip(fn.arg_names, args))
    bound.update({k: v for k, v in kwargs.items() if k not in OPTIONS})
    sig, const, attrs = {}, {}, {}
    for i, (name, p) in enumerate(zip(fn.arg_names, fn.params)):
        if name not in bound:  # a constexpr left at its default
            sig[name], const[name] = "constexpr", p.default
            continue
        val = bound[name]
        if p.is_constexpr:
            sig[name], const[name] = "constexpr", val
        elif isinstance(val, torch.Tensor):
            sig[name] = DTYPES[val.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(val, bool):
            sig[name] = "i1"
        elif isinstance(val, int):
            sig[name] = "i32" if -2**31 <= val < 2**31 else "i64"
            if val % 16 == 0 and name not in fn.do_not_specialize and i not in fn.do_not_specialize:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    return sig, const, attrs


def cuobjdump(cubin: bytes, flag: str) -> str:
    """``cuobjdump <flag>`` (the one shipped with Triton) of a cubin: its output."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True).stdout


def resources(cubin: bytes) -> str:
    line = next((ln for ln in cuobjdump(cubin, "--dump-resource-usage").splitlines() if "REG:" in ln), "")
    return " ".join(x for x in line.split() if x.split(":")[0] in ("REG", "STACK", "SHARED", "LOCAL"))


SASS_OP = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def sass_counts(cubin: bytes) -> str:
    """The cubin's sm_90 instructions (``cuobjdump -sass``): how many in all (static: a loop's body counts
    once), and the exponentials and divisions' ``MUFU``, the compares ``FSETP``, the barriers ``BAR``."""
    ops = [m.group(1) for ln in cuobjdump(cubin, "-sass").splitlines() for m in [SASS_OP.match(ln)] if m]
    return f"INSTR:{len(ops)} " + " ".join(f"{op}:{ops.count(op)}" for op in ("MUFU", "FSETP", "BAR"))


def capture_launches(C, H, K, V, precision, taps, l2norm=False, op=False, gate="none", infer=False):
    """Every kernel launch ``(fn, args, kwargs, grid)`` of one forward+backward on small CPU tensors
    (T = 2 chunks), intercepted instead of run. ``taps``: True for every tap, or a list of tap names.
    ``op``: through the autograd op ``chunk_kda`` (outputs and gradients stored in the inputs' bf16), not
    ``kda_forward_backward``. ``gate``: ``none`` (pre-gated g), ``softplus`` or ``lower_bound`` (the
    in-kernel gate, with ``A_log``, ``dt_bias``). ``infer``: the op's forward alone under ``torch.no_grad``
    (the inference forward: ``kda_forward(keep_state=False)``)."""
    from triton.runtime.jit import JITFunction

    from kdadbg_kernels.chunk import chunk_kda, kda_forward_backward
    from kdadbg_kernels.taps import TapSelection

    launches = []

    def capture(self, *args, grid, warmup, **kwargs):
        launches.append((self, args, kwargs, grid))

    saved, JITFunction.run = JITFunction.run, capture
    try:
        T = 2 * C
        q, k = torch.randn(1, T, H, K, dtype=torch.bfloat16), torch.randn(1, T, H, K, dtype=torch.bfloat16)
        v, do = torch.randn(1, T, H, V, dtype=torch.bfloat16), torch.randn(1, T, H, V, dtype=torch.bfloat16)
        g, beta = -torch.rand(1, T, H, K), torch.rand(1, T, H)
        sel = None if not taps else TapSelection() if taps is True else TapSelection(names=tuple(taps))
        A_log, dt_bias = (torch.zeros(H), torch.zeros(H, K)) if gate != "none" else (None, None)
        if op or infer:
            x = [t.requires_grad_(True) for t in (q, k, v, g, beta)]
            gate_kw = dict(use_gate_in_kernel=gate != "none", A_log=A_log, dt_bias=dt_bias,
                           lower_bound=-5.0 if gate == "lower_bound" else None)
            with torch.set_grad_enabled(not infer):
                o = chunk_kda(*x, chunk_size=C, use_qk_l2norm_in_kernel=l2norm,
                              use_beta_sigmoid_in_kernel=l2norm, precision=precision, taps=sel, **gate_kw)[0]
            if not infer:
                torch.autograd.grad(o, x, do)  # the backward launches are captured too (o is never computed)
        else:
            kda_forward_backward(q, k, v, g, beta, do, scale=K ** -0.5, chunk_size=C, qk_l2norm=l2norm,
                                 beta_sigmoid=l2norm, precision=precision, taps=sel, gate=gate, A_log=A_log,
                                 dt_bias=dt_bias)
    finally:
        JITFunction.run = saved
    return launches


def compile_sm90(fn, args, kwargs):
    """One captured launch compiled by Triton for ``cuda:90``, with its own constexprs and options."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, const, attrs = _signature(fn, args, kwargs)
    opts = {k: v for k, v in kwargs.items() if k in OPTIONS}
    return triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options=opts)


def shape_parser(doc: str) -> argparse.ArgumentParser:
    """The options of the offline sm_90 checks (this script, ``loop_check.py``): the launch shape and mode."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--V", type=int, default=128)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    return ap


def main(argv=None):
    ap = shape_parser(__doc__)
    ap.add_argument("--taps", nargs="*", default=None, metavar="NAME",
                    help="taps on: every tap, or only those named (to see which taps cost registers)")
    ap.add_argument("--only", nargs="*", default=None, help="compile only kernels whose name contains one of these")
    ap.add_argument("--op", action="store_true", help="the autograd op's launches (bf16 outputs and gradients)")
    ap.add_argument("--infer", action="store_true",
                    help="the op's forward alone under torch.no_grad (the inference forward's launches)")
    ap.add_argument("--setting", default="pregated", choices=["pregated", "softplus", "lower_bound"],
                    help="bench.py's input settings: pregated g, or the gate, l2norm and beta sigmoid in the kernel")
    ap.add_argument("--sass", action="store_true",
                    help="also count each kernel's sm_90 instructions (static; MUFU, FSETP and BAR apart)")
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("kernel_resources: unset TRITON_INTERPRET (the kernels must be compiled, not interpreted)")
    for fn, args, kwargs, grid in capture_launches(a.chunk_size, a.H, a.K, a.V, a.precision,
                                                      True if a.taps == [] else a.taps, op=a.op, infer=a.infer,
                                                      l2norm=a.setting != "pregated",
                                                      gate="none" if a.setting == "pregated" else a.setting):
        if a.only and not any(x in fn.__name__ for x in a.only):
            continue
        ck = compile_sm90(fn, args, kwargs)
        smem = ck.metadata.shared
        print(f"{fn.__name__:<32} grid={tuple(grid) if not callable(grid) else grid} "
              f"warps={kwargs.get('num_warps', 4)} stages={kwargs.get('num_stages', 3)} {resources(ck.asm['cubin'])} "
              f"SMEM:{smem}{' OVER' if smem > SMEM_SM90 else ''}{' ' + sass_counts(ck.asm['cubin']) if a.sass else ''}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
