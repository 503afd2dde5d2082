"""Time the float64 reference (forward + backward + every tap) on one large dump.

    python benchmarks/reference_cpu.py [--T 8192] [--H 16] [--K 128] [--V 128] [--device cpu]

Prints one line: shape, chunk size, seconds (wall clock, one run after a tiny warm-up) and peak
resident memory.
"""

import argparse
import resource
import time

import torch

from kdadbg.cases import Case, make_inputs
from kdadbg.reference import run_reference


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--V", type=int, default=128)
    ap.add_argument("--chunk-size", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    from devices import use_device

    use_device("reference_cpu.py", a.device, cpu="--device cpu, the reference on this machine's CPU")
    run_reference(*make_inputs(Case("warm", T=32, H=1, K=16, V=16)), device=a.device)
    case = Case("bench", T=a.T, H=a.H, K=a.K, V=a.V, chunk_size=a.chunk_size)
    inputs, cfg = make_inputs(case)
    if a.device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = run_reference(inputs, cfg, device=a.device)
    if a.device == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"reference fwd+bwd+{len(res.taps)} taps  B=1 T={a.T} H={a.H} K={a.K} V={a.V} "
          f"C={a.chunk_size} device={a.device} threads={torch.get_num_threads()}: {dt:.1f} s, peak RSS {rss:.1f} GiB")


if __name__ == "__main__":
    main()
