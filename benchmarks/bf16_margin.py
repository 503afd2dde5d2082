"""How close bf16 mode comes to fla's bars: each output's error ratio divided by its tolerance, over seeds.

    python benchmarks/bf16_margin.py [--cases chunk64 chunk64_varlen ...] [--seeds 0 1 2 ...]
                                     [--chunk-size 64] [--device cpu|cuda] [--json FILE]

For each case of ``kdadbg.cases`` (by default every kernel case whose chunk size is ``--chunk-size``,
with that chunk size forced on the others when named with ``--cases``) and each seed, runs our kernels
in bf16 mode and the float64 reference, and prints, per output, the worst and the mean of
``ratio / tolerance`` (fla's metric and bars, ``kdadbg.tolerances``; 0 where the tensor passes
outright, within 1e-6 everywhere) over the seeds. A value above 1 misses the bar. On a CPU the kernels run under the Triton interpreter, which emulates the GPU's bf16
and tf32 operand rounding (``kernels/tlmath.py``); launch-parameter knobs such as
``KDADBG_DQKG_SPLIT`` apply as on the GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=None, help="case names (default: the kernel cases at --chunk-size)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from devices import use_device

    use_device("bf16_margin.py", a.device,
                 cpu="--device cpu (the default), emulating the GPU's operand rounding under the interpreter")
    from kdadbg.impls.ours import run_kernels
    from kdadbg.cases import BY_NAME, KERNEL_CASES, make_inputs
    from kdadbg.compare import ABS_PASS, compare
    from kdadbg.reference import run_reference
    from kdadbg.tapsfile import outputs_that_apply
    from kdadbg.tolerances import TOLERANCES

    if a.cases:
        unknown = [n for n in a.cases if n not in BY_NAME]
        if unknown:
            sys.exit(f"bf16_margin: --cases: unknown {unknown}; known: {sorted(BY_NAME)}")
        cases = [dataclasses.replace(BY_NAME[n], chunk_size=a.chunk_size) for n in a.cases]
    else:
        cases = [c for c in KERNEL_CASES if c.chunk_size == a.chunk_size]
    knobs = {k: v for k, v in os.environ.items() if k.startswith("KDADBG_")}
    print(f"bf16 mode, chunk {a.chunk_size}, seeds {a.seeds}, knobs {knobs or 'none'}", flush=True)
    rows = []
    for case in cases:
        per_key: dict[str, list[float]] = {}
        for seed in a.seeds:
            inputs, cfg = make_inputs(dataclasses.replace(case, T=max(case.T, 1)), seed=seed)
            ref = run_reference(inputs, cfg, taps=(), device=a.device)
            out, _, _ = run_kernels(inputs, cfg, "bf16", a.device)
            for key in outputs_that_apply(inputs, cfg):
                tol = TOLERANCES["bf16"][key]
                c = compare(key, out[key], ref.outputs[key])
                # a tensor within ABS_PASS of the reference passes outright (fla's rule): margin 0
                margin = float("inf") if c.nonfinite else 0.0 if c.max_abs <= ABS_PASS else c.ratio / tol
                per_key.setdefault(key, []).append(margin)
        for key, vals in per_key.items():
            worst = max(vals)
            rows.append(dict(case=case.name, key=key, worst=worst, mean=sum(vals) / len(vals),
                             worst_seed=a.seeds[vals.index(worst)]))
            print(f"{case.name:<18} {key:<9} worst {worst:6.3f} (seed {rows[-1]['worst_seed']:>2}) "
                  f"mean {rows[-1]['mean']:6.3f}{'  MISS' if worst > 1 else ''}", flush=True)
    misses = [r for r in rows if r["worst"] > 1]
    print(f"{len(misses)} of {len(rows)} (case, output) pairs miss their bar at some seed", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"chunk_size": a.chunk_size, "seeds": a.seeds, "knobs": knobs, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
