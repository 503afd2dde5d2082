"""Taps must not move a reduction to another register layout: an offline check for sm_90, no GPU needed.

    python benchmarks/layout_check.py [--chunk-size 16] [--K 128] [--V 128] [--precision fp32 bf16]
                                      [--only NAME ...]

Why: ``tl.sum`` and ``tl.cumsum`` add in an order that follows the register layout the compiler gives
their operand, and that layout is chosen from the whole kernel, tap stores included. On the H200
(Triton 3.6) switching taps on moved the K pass's reverse scan of dgc to another layout, and dg changed
in its last bits. Outputs with taps on must be the same bits as with taps off.

It also compares the products (``tt.dot``, ``ttng.warp_group_dot``) whose accumulator is not a constant:
Triton folds ``dot(a, b) + c`` into ``dot(a, b, c)`` only where the product has no other use, so a tap
that reads a product's result can change how the sum after it rounds (it did for dg in fp32 mode on the H200).

Runs one forward+backward on small CPU tensors with every launch intercepted (as
``kernel_resources.py`` does), once with taps off and once with every tap on; compiles each launch for
``cuda:90``; and compares, kernel by kernel, the operand layouts of the ``tt.reduce``/``tt.scan`` ops
at the same source line (op and operand shape too): every one taps on has must have a layout that taps off
has there; a source line that only the taps-on variant has is tap-only code (``moved``). A kernel that
runs only with taps has nothing to compare with and is skipped. Exit 1
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


LOC = re.compile(r"loc\((#\w+)\)\s*$")


def source(loc: str, defs: dict) -> str:
    """``file:line:col`` of the op at ``loc`` itself (a call site's callee, a named location's inner one)."""
    for _ in range(64):
        body = defs.get(loc, "")
        m = re.match(r"loc\(callsite\((#\w+) at #\w+\)\)", body) or re.match(r'loc\("[^"]*"\((#\w+)\)\)', body)
        if not m:
            break
        loc = m.group(1)
    m = re.match(r'loc\("([^"]+)":(\d+):(\d+)\)', defs.get(loc, ""))
    return f"{os.path.basename(m.group(1))}:{m.group(2)}:{m.group(3)}" if m else "?"


def reductions(ttgir: str) -> list[tuple[str, str, str, str]]:
    """(op and axis, operand shape, operand layout, source line of the op) of every reduce/scan, in
    program order."""
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
        loc = LOC.search(lines[j])
        out.append((f"{m.group(1)} axis {m.group(3)}", t.group(1), layout, source(loc.group(1), defs) if loc else "?"))
    return out


def moved(r0: list, r1: list) -> list[str]:
    """The reductions of ``r1`` (taps on) whose layout is none of those ``r0`` (taps off) has at the same
    source line, op and shape, and those of ``r0`` that ``r1`` lacks. A source line only ``r1`` has is
    tap-only code: the tap variant's extra reductions may come anywhere, and a helper that two loops share has one source line for both."""
    def by_line(r):
        d = {}
        for op, shape, layout, line in r:
            d.setdefault((line, op, shape), set()).add(layout)
        return d
    d0, d1 = by_line(r0), by_line(r1)
    out = [f"{op} of {shape} at {line}: taps on has no such reduction" for (line, op, shape) in d0 if
           (line, op, shape) not in d1]
    for key, layouts in d1.items():
        for x in sorted(layouts - d0.get(key, layouts)):
            out.append(f"{key[1]} of {key[2]} at {key[0]}: {' or '.join(sorted(d0[key]))} -> {x}")
    return out


DOT = re.compile(r"= (tt\.dot|ttng\.warp_group_dot) %[\w#]+, %[\w#]+, (%[\w#]+)")


def accumulating_dots(ttgir: str) -> list[str]:
    """The products whose accumulator is not a constant, in program order: where Triton folded the add
    that follows a product into the product's accumulator. A second use of the product's result stops
    that fold, and the sum then rounds differently (dg with taps on in fp32 mode did on the H200)."""
    out = []
    for line in ttgir.splitlines():
        m = DOT.search(line)
        if m and not m.group(2).startswith("%cst"):
            out.append(m.group(1) + " " + ALIAS.sub("", line.split(" : ", 1)[1].split(" loc(")[0]))
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
        ir0, ir1 = (compile_sm90(f, x, kw).asm["ttgir"] for f, x, kw in ((fn, a0, k0), (fn1, a1, k1)))
        r0, r1 = reductions(ir0), reductions(ir1)
        diff = [f"{fn.__name__}: {x}" for x in moved(r0, r1)]
        d0, d1 = accumulating_dots(ir0), accumulating_dots(ir1)
        if d0 != d1:
            diff.append(f"{fn.__name__}: {len(d0)} products with an accumulator off, {len(d1)} on")
        log(f"C={C} K={K} V={V} {precision:<5} {fn.__name__:<28} {len(r0)} reductions off, {len(r1)} on, "
            f"{len(d0)} accumulating products: " + ("SAME" if not diff else "DIFFERENT"))
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
        print("DIFFERENT:", line)
    print("taps leave every reduction's layout and every product's accumulator unchanged" if not bad
          else f"{len(bad)} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
