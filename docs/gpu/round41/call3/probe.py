"""Round 41 call 3: the carried-in rule's coherence bound, now applied in bf16 mode too, on fla's bf16 kernels and
ours at model size (T 8192, H 16, K = V = 128, chunk 64: fla takes 32 or 64): each run's verdict and its dA_log / ddt_bias rows (ratio, carried
in or not, coherence), so that a bf16 implementation's own rounding is seen to stay under COHERENT (30)."""
import dataclasses
import sys
import time

from kdadbg.cases import get_case, make_inputs
from kdadbg.compare.carried import coherence
from kdadbg.impls import resolve_impl
from kdadbg.reference import run_reference
from kdadbg.run import check

for name in sys.argv[1:]:
    inputs, cfg = make_inputs(dataclasses.replace(get_case(name), T=8192, H=16, K=128, V=128, chunk_size=64), seed=1)
    ref_dg = None
    for impl in ("ours", "fla"):
        t = time.time()
        res = check(inputs, cfg, impl=resolve_impl(impl, "bf16"), device="cuda")
        rows = {r.name: r for r in res.tensors}
        out = [f"{n} ratio {rows[n].ratio:.3g} tol {rows[n].tol:g} passed {rows[n].passed} carried {rows[n].carried} "
               f"coherent {rows[n].coherent}" for n in ("dg", "dA_log", "ddt_bias") if n in rows]
        got = resolve_impl(impl, "bf16").run(inputs, cfg, device="cuda").outputs["dg"]
        if ref_dg is None:
            ref_dg = run_reference(inputs, cfg, taps=(), device="cuda").outputs["dg"]
        c = coherence(got, ref_dg, inputs, cfg)
        print(f"{name} {impl} bf16: verdict {res.verdict}; " + "; ".join(out) +
              f"; coherence dA_log max {float(c['dA_log'].nan_to_num().max()):.2f}, ddt_bias max "
              f"{float(c['ddt_bias'].nan_to_num().max()):.2f} ({time.time() - t:.0f} s)", flush=True)
        for r in res.tensors:
            if r.passed is not True:
                print(f"  {r.name}: ratio {r.ratio:.4g} tol {r.tol:g} max_abs {r.max_abs:.3g} storage {r.storage} "
                      f"unrep {r.unrep} floor {r.precision_floor} nonfinite {r.nonfinite}", flush=True)
        for n in res.notes:
            print(f"  note: {n[:300]}", flush=True)
