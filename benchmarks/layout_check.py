"""Taps must not move a reduction to another register layout: an offline check for sm_90, no GPU needed.

    python benchmarks/layout_check.py [--chunk-size 16] [--K 128] [--V 128] [--precision fp32 bf16]
                                      [--only NAME ...]

Why: ``tl.sum`` and ``tl.cumsum`` add in an order that follows the register layout the compiler gives
their operand, and that layout is chosen from the whole kernel, tap stores included. On the H200
(Triton 3.6) switching taps on moved the K pass's reverse scan of dgc to another layout, and dg changed
in its last bits (docs/gpu/round7). Outputs with taps on must be the same bits as with taps off.

Runs one forward+backward on small CPU tensors with every launch intercepted (as
``kernel_resources.py`` does), once with taps off and once with every tap on; compiles each launch for
``cuda:90``; and compares, kernel by kernel, the operand layouts of the ``tt.reduce``/``tt.scan`` ops
that both variants have, in order (the taps-on variant's extra, tap-only reductions come last in
every kernel here); a kernel that runs only with taps has nothing to compare with and is skipped. Exit 1
when any differs. The layouts depend on the Triton version: run it with
the GPU machine's (3.6) for a verdict about that machine.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from importlib.metadata import version


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_resources import capture_launches, compile_sm90  # noqa: E402

OP = re.compile(r'"tt\.(scan|reduce)"\(([^)]*)\) <\{axis = (\d+)')
TYPE = re.compile(r"\}\) : \(tensor<([^,]+), (.*?)>\) ->")
ALIAS = re.compile(r"#\w+")


def reductions(ttgir: str) -> list[tuple[str, str, str]]:
    """(op and axis, operand shape, operand layout) of every reduce/scan, in program order."""
    lines = ttgir.splitlines()
    defs = dict(re.findall(r"^(#\w+) = (.*)$", ttgir, re.M))
    out = []
    for i, line in enumerate(lines):
        m = OP.search(line)
        if not m:
            continue
        j = i
        while not lines[j].lstrip().startswith("})"):  # the op's region ends with its result types
            j += 1
        t = TYPE.search(lines[j])
        layout = ALIAS.sub(lambda a: defs.get(a.group(0), a.group(0)), t.group(2))  # aliases spelled out
        out.append((f"{m.group(1)} axis {m.group(3)}", t.group(1), layout))
    return out


def check(C, K, V, precision, only=None, log=print) -> list[str]:
    """Kernels (with the differing op) whose reductions change layout when taps are switched on."""
    off = capture_launches(C, 2, K, V, precision, taps=False, l2norm=True)
    on = capture_launches(C, 2, K, V, precision, taps=True, l2norm=True)
    taps_only = {fn for fn, *_ in on} - {fn for fn, *_ in off}  # kernels that only write taps
    on = [x for x in on if x[0] not in taps_only]
    bad = []
    for (fn, a0, k0, _), (fn1, a1, k1, _) in zip(off, on):
        assert fn is fn1, (fn.__name__, fn1.__name__)
        if only and not any(x in fn.__name__ for x in only):
            continue
        r0, r1 = (reductions(compile_sm90(f, x, kw).asm["ttgir"]) for f, x, kw in ((fn, a0, k0), (fn1, a1, k1)))
        diff = [f"{fn.__name__}: {x[0]} of {x[1]}: {x[2]} -> {y[2]}" for x, y in zip(r0, r1) if x != y]
        log(f"C={C} K={K} V={V} {precision:<5} {fn.__name__:<28} {len(r0)} reductions off, {len(r1)} on: "
            + ("SAME" if not diff else "DIFFERENT"))
        bad += diff
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunk-size", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--V", type=int, default=128)
    ap.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--only", nargs="*", default=None, help="check only kernels whose name contains one of these")
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("layout_check: unset TRITON_INTERPRET (the kernels must be compiled, not interpreted)")
    print(f"triton {version('triton')}, target sm_90", flush=True)
    bad = []
    for C in a.chunk_size:
        for p in a.precision:
            bad += check(C, a.K, a.V, p, a.only, log=lambda s: print(s, flush=True))
    for line in bad:
        print("DIFFERENT LAYOUT:", line)
    print("taps leave every reduction's layout unchanged" if not bad else f"{len(bad)} reductions change layout")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
