"""Where the time goes: CUDA time per kernel of our forward+backward (torch.profiler), one shape.

    python benchmarks/kernel_profile.py [--H 16] [--T 16384] [--D 128] [--chunk-size 64] [--precision bf16]
                                 [--iters 5] [--varlen] [--taps-window N] [--peer fla] [--json FILE]

Inputs as ``benchmarks/bench.py`` (bf16 q/k/v, fp32 log-decay, no in-kernel gate/l2norm/sigmoid).
After a warm-up call (compilation), ``--iters`` calls of forward+backward are profiled; the table
gives each kernel's mean CUDA time per call and its share of the total kernel time, beside the
wall time of a forward and a forward+backward (``do_bench`` medians): where the wall time exceeds the
kernel time, the host (launches, synchronising copies) is the bound. ``--varlen``: ``bench.py``'s
varlen batch of six sequences (``--T`` is then their total, 16384). ``--taps-window N``: every tap
on for chunks [0, N) and all heads (as ``bench.py``'s taps-on timing), so the table shows where the
taps' extra time goes: the tap-storing kernel variants, the NaN fills of the buffers.
``--peer fla``: the same table for fla's ``chunk_kda`` (chunk 64, ``FLA_FLASH_KDA=0`` as in
``bench.py``) on the same inputs, to compare kernel by kernel. Its first call autotunes for minutes;
with ``TRITON_CACHE_AUTOTUNING=1`` Triton keeps the chosen configs in its cache directory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--varlen", action="store_true", help="bench.py's six mixed-length sequences")
    ap.add_argument("--taps-window", type=int, default=0, help="every tap on for chunks [0, N) (0: taps off)")
    ap.add_argument("--peer", default="ours", choices=["ours", "fla"],
                    help="whose chunk_kda to profile (fla: fla-core's, importable as fla)")
    ap.add_argument("--per-launch", action="store_true",
                    help="also a row per launch in call order (a kernel launched over the tap window and "
                         "over the chunks outside it shows as two rows)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.peer == "fla" and (a.taps_window or a.precision != "bf16" or a.chunk_size != 64):
        ap.error("--peer fla: fla has no taps, runs bf16 inputs as they are, and is timed at chunk 64")
    import torch
    import triton.testing
    from bench import MIXED6
    from peer_inputs import peer_inputs
    from torch.profiler import ProfilerActivity, profile

    from kdadbg_kernels.chunk import chunk_kda
    from kdadbg_kernels.taps import TapSelection

    T, H, D = (sum(MIXED6) if a.varlen else a.T), a.H, a.D
    x, cu, do = peer_inputs(T, H, D, torch.device("cuda"), lens=MIXED6 if a.varlen else None)

    cu_cpu = cu.cpu() if cu is not None else None
    taps = TapSelection(chunks=(0, a.taps_window)) if a.taps_window else None

    if a.peer == "fla":
        import os
        os.environ.setdefault("FLA_FLASH_KDA", "0")
        from fla.ops.kda import chunk_kda as fla_kda
        kw = dict(cu_seqlens=cu, chunk_size=64) | ({"cu_seqlens_cpu": cu_cpu} if cu is not None else {})

        def fwd():
            return fla_kda(**x, **kw)[0]
    else:
        def fwd():
            return chunk_kda(**x, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu, chunk_size=a.chunk_size,
                             precision=a.precision, taps=taps)[0]

    def step():
        return torch.autograd.grad(fwd(), list(x.values()), do)

    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.iters):
            step()
        torch.cuda.synchronize()
    per = defaultdict(float)
    calls = defaultdict(int)
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t:
            per[ev.key] += t / a.iters / 1000.0
            calls[ev.key] += ev.count // a.iters
    total = sum(per.values())
    rows = sorted(per.items(), key=lambda kv: -kv[1])
    wall = {"fwd": triton.testing.do_bench(fwd, return_mode="median"),
            "fwdbwd": triton.testing.do_bench(step, return_mode="median")}
    print(f"{a.peer}: H={H} T={T} D={D} C={a.chunk_size} precision={a.precision} varlen={a.varlen} "
          f"taps_window={a.taps_window}: first call {first:.1f} s, "
          f"kernel time per fwd+bwd {total:.3f} ms; wall fwd {wall['fwd']:.3f} ms, fwd+bwd {wall['fwdbwd']:.3f} ms")
    print(f"{'kernel':<60} {'ms/call':>8} {'share':>6} {'launches':>8}")
    for name, ms in rows:
        print(f"{name[:60]:<60} {ms:8.3f} {ms / total:6.1%} {calls[name]:8d}")
    seq = per_launch(prof.events(), a.iters, "CUDA") if a.per_launch else []
    if seq:
        print(f"{'#':>3} {'launch, in call order':<60} {'ms/call':>8}")
        for i, (name, ms) in enumerate(seq):
            print(f"{i:3d} {name[:60]:<60} {ms:8.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shape": vars(a), "first_call_s": first, "total_ms": total, "wall_ms": wall,
                       "kernels": [{"name": n, "ms": ms, "launches": calls[n]} for n, ms in rows],
                       "launches": [{"name": n, "ms": ms} for n, ms in seq]}, f, indent=2)
    return 0


def per_launch(events, iters: int, device: str) -> list[tuple[str, float]]:
    """Each launch of one call, in start order, with its mean time over ``iters`` identical calls (ms):
    the ``device`` events (``"CUDA"``) sorted by start and cut into ``iters`` equal runs. Empty (with
    a note) when the runs do not line up name by name."""
    evs = sorted((e for e in events if str(getattr(e, "device_type", "")).split(".")[-1] == device),
                 key=lambda e: e.time_range.start)
    n = len(evs) // iters if iters else 0
    runs = [evs[i * n:(i + 1) * n] for i in range(iters)]
    if not n or len(evs) != n * iters or any([e.name for e in r] != [e.name for e in runs[0]] for r in runs):
        print(f"per launch: {len(evs)} {device} events do not split into {iters} identical calls", file=sys.stderr)
        return []
    return [(runs[0][j].name, sum(r[j].time_range.elapsed_us() for r in runs) / iters / 1000.0) for j in range(n)]


if __name__ == "__main__":
    sys.exit(main())
