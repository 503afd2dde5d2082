"""Error ratios of our outputs and gradients against the float64 reference on one large case, for A/B
runs of numerics (one process per variant: ``KDADBG_*`` knobs, or another copy of ``kernels/`` first
on ``PYTHONPATH``).

    python benchmarks/accuracy_ab.py [--T 8192] [--H 16] [--K 128] [--V 128] [--chunk-size 64]
        [--gate lower_bound] [--gates random] [--layout kv] [--dtype float32] [--precision fp32]
        [--device cuda] [--seed 7] [--tag TAG] [--json-lines FILE]

The defaults are ``tests/test_kernels_gpu.py``'s ``chunk64_T8192_H16_kv`` case (seed 7). Prints fla's
ratio ``RMS(ref - x) / (RMS(ref) + 1e-8)`` of every output with its tolerance; taps stay off (they do
not change the outputs' bits: tested).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_resources import shape_parser  # noqa: E402


def main(argv=None):
    ap = shape_parser(__doc__)  # --H --K --V --chunk-size --precision
    ap.set_defaults(precision="fp32")
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--gate", default="lower_bound", choices=["lower_bound", "softplus", "none"])
    ap.add_argument("--gates", default="random", choices=["random", "lower", "zero", "masked"])
    ap.add_argument("--layout", default="kv", choices=["kv", "vk"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--tag", default="")
    ap.add_argument("--json-lines", default=None, help="append the result as one JSON line to this file")
    a = ap.parse_args(argv)
    from devices import use_device

    use_device("accuracy_ab.py", a.device, cpu="--device cpu, the kernels under the Triton interpreter (small cases)")

    import kdadbg_kernels
    from kdadbg.impls.ours import run_kernels
    from kdadbg.cases import Case, make_inputs
    from kdadbg.compare import compare
    from kdadbg.reference import run_reference
    from kdadbg.tapsfile import outputs_that_apply
    from kdadbg.tolerances import TOLERANCES

    case = Case("accuracy_ab", T=a.T, H=a.H, K=a.K, V=a.V, chunk_size=a.chunk_size, gate=a.gate, gates=a.gates,
                state_layout=a.layout, dtype=a.dtype)
    inputs, cfg = make_inputs(case, seed=a.seed)
    t0 = time.time()
    ref = run_reference(inputs, cfg, taps=(), device=a.device)
    t1 = time.time()
    out, _, _ = run_kernels(inputs, cfg, a.precision, a.device, taps=None)
    t2 = time.time()
    tol = TOLERANCES[a.precision]
    ratios = {k: compare(k, out[k], ref.outputs[k]).ratio for k in outputs_that_apply(inputs, cfg)}
    print(f"{a.tag or 'default':<28} kernels {Path(kdadbg_kernels.__file__).parent} (reference {t1 - t0:.1f} s, "
          f"kernels {t2 - t1:.1f} s)")
    print("  " + "  ".join(f"{k}={r:.3e}{'!' if r > tol[k] else ''}" for k, r in ratios.items())
          + f"   ('!': over the {a.precision} tolerance)")
    if a.json_lines:
        with open(a.json_lines, "a") as f:
            f.write(json.dumps({"tag": a.tag, "args": vars(a), "ratios": ratios, "tolerances": tol}) + "\n")


if __name__ == "__main__":
    main()
