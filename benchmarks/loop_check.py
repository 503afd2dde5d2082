"""The state passes' chunk loops must not wait on a load inside a step: an offline check for sm_90.

    python benchmarks/loop_check.py [--H 16] [--chunk-size 64] [--K 128] [--V 128] [--precision bf16] [--taps]

Why: the two state passes walk a sequence's chunks one after the other, so each step's latency adds
up over the sequence. Their sm_90 code once had loads that one step waited on: the chunk
table's ``chunk_start``/``chunk_len`` (which the next step's tile copies needed for their addresses)
and the loads that feed no ``tl.dot`` (``gT``; the backward's ``dU0``), which Triton's pipeliner
leaves synchronous. Removing them took the backward state pass from 0.834 to 0.363 ms and the
forward from 0.614 to 0.510 at H16 T16384 on the H200.

Runs one forward+backward on small CPU tensors with the launches intercepted (as
``kernel_resources.py`` does), compiles the two state passes (taps off, or on with ``--taps``) for
``cuda:90`` and reads their TTGIR. In the body of each ``scf.for``, a ``tt.load`` whose result is used by anything but the
loop's ``scf.yield`` is a load the step waits on (one whose result only goes to ``scf.yield`` is a
prefetch for the next step). Also prints the tile copies (``async_copy_global_to_local``) and the
``async_wait`` counts: ``num = 0`` means a step waits for every copy in flight. Exit 1 when a
state pass has a load it waits on. The code depends on the Triton version: run it with the GPU
machine's (3.6) for a verdict about that machine.
"""

from __future__ import annotations

import os
import re
import sys
from importlib.metadata import version

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_resources import capture_launches, compile_sm90, shape_parser  # noqa: E402

STATE_PASSES = ("kda_fwd_recurrence_kernel", "recurrence_bwd_kernel")
LOAD = re.compile(r"^\s*(%[\w.]+)(?::\d+)? = tt\.load ")
WAIT = re.compile(r"ttg\.async_wait .*\{num = (\d+) : i32\}")


def loop_bodies(ttgir: str) -> list[list[str]]:
    """The lines of each ``scf.for`` body (nested loops are listed again on their own)."""
    lines = ttgir.splitlines()
    bodies = []
    for i, line in enumerate(lines):
        if " scf.for " not in line:
            continue
        indent = len(line) - len(line.lstrip())
        j = i + 1
        while not (lines[j].lstrip().startswith("}") and len(lines[j]) - len(lines[j].lstrip()) == indent):
            j += 1
        bodies.append(lines[i + 1:j])
    return bodies


def waited_loads(body: list[str]) -> list[str]:
    """Results of the body's ``tt.load``s that the body uses other than in its ``scf.yield``."""
    out = []
    for line in body:
        m = LOAD.match(line)
        if not m:
            continue
        use = re.compile(re.escape(m.group(1)) + r"(?![\w.])")
        users = [x for x in body if x is not line and use.search(x)]
        if any(not x.lstrip().startswith("scf.yield") for x in users):
            out.append(m.group(1))
    return out


def check(H, C, K, V, precision, log=print, taps=False) -> list[str]:
    """Names of the state passes that wait on a load inside a step (with ``taps``: their tap variants)."""
    bad = []
    for fn, args, kwargs, _ in capture_launches(C, H, K, V, precision, taps=taps):
        if fn.__name__ not in STATE_PASSES:
            continue
        ttgir = compile_sm90(fn, args, kwargs).asm["ttgir"]
        for body in loop_bodies(ttgir):
            waited = waited_loads(body)
            copies = sum("async_copy_global_to_local" in x for x in body)
            waits = [int(m.group(1)) for x in body for m in [WAIT.search(x)] if m]
            log(f"{fn.__name__:<28} stages={kwargs.get('num_stages', 3)} tile copies={copies} "
                f"async_wait num={waits} loads waited on in the step: {', '.join(waited) or 'none'}")
            if waited:
                bad.append(fn.__name__)
    return bad


def main(argv=None):
    p = shape_parser(__doc__)
    p.add_argument("--taps", action="store_true", help="the launches with every tap on")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("loop_check: unset TRITON_INTERPRET (the kernels must be compiled, not interpreted)")
    print(f"triton {version('triton')}, sm_90, H={a.H} C={a.chunk_size} K={a.K} V={a.V} {a.precision}"
          + (" taps on" if a.taps else ""))
    bad = check(a.H, a.chunk_size, a.K, a.V, a.precision, taps=a.taps)
    if bad:
        print(f"loop_check: a step waits on a load in: {', '.join(sorted(set(bad)))}")
        return 1
    print("no state-pass step waits on a load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
