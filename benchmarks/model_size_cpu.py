"""A realistic preset at model size (tests/test_kernels_gpu.py's REAL_GPU: T 8192, H 8, K = V = 128) diffed
on the CPU, our kernels under the Triton interpreter (about 13 minutes for a chunk-64 preset in one mode on
a 2-core machine): the counts and every failing cell that is not UNREP.

    python benchmarks/model_size_cpu.py fla_layer_varlen bf16
"""

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from test_kernels_gpu import _not_ok, _real_gpu   # noqa: E402

from kdadbg.diff import diff_dump   # noqa: E402
from kdadbg.impls import resolve_impl   # noqa: E402


def main():
    name, prec = sys.argv[1], sys.argv[2]
    inputs, cfg = _real_gpu(name)
    t0 = time.time()
    res = diff_dump(inputs, cfg, resolve_impl("ours", prec, None), device="cpu", window=0, max_interpreter_s=1e9)
    print(name, prec, res.counts(), "passed", res.passed, round(time.time() - t0), "s", flush=True)
    print("not ok (tap, chunk, head, label, ratio, floor, tol):", _not_ok(res, 30), flush=True)


if __name__ == "__main__":
    main()
