"""Two forward+backward calls of ours, nothing else: the program Nsight Compute profiles.

    python benchmarks/ncu_step.py [--setting lower_bound] [--H 32] [--T 16384] [--D 128] [--calls 2]
                                  [--taps-window N]

Inputs as ``benchmarks/bench.py``'s (``peer_inputs.setting_inputs``), chunk 64, bf16 mode. The first call
compiles; ``ncu --launch-skip`` past its launches then profiles the second's (kernel_profile.py's timing
loops would run for minutes under the profiler). ``--taps-window N``: every tap on for chunks [0, N), as
``bench.py``'s taps-on timing (the kernels parallel over chunks then launch twice: over the window with the
tap-storing variant, and after it)."""

from __future__ import annotations

import argparse


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", default="lower_bound")
    ap.add_argument("--H", type=int, default=32)
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--taps-window", type=int, default=0, help="every tap on for chunks [0, N) (0: taps off)")
    a = ap.parse_args(argv)
    from devices import use_device

    use_device("ncu_step.py")
    import torch
    from peer_inputs import SETTINGS, setting_inputs

    from kdadbg_kernels.chunk import chunk_kda
    from kdadbg_kernels.taps import TapSelection

    x, cu, do = setting_inputs(a.setting, a.T, a.H, a.D, torch.device("cuda"))
    for _ in range(a.calls):
        o = chunk_kda(**x, **SETTINGS[a.setting], chunk_size=64, precision="bf16",
                      taps=TapSelection(chunks=(0, a.taps_window)) if a.taps_window else None)[0]
        torch.autograd.grad(o, list(x.values()), do)
        torch.cuda.synchronize()
    print(f"ncu_step: {a.calls} forward+backward calls, {a.setting} H{a.H} T{a.T} D{a.D}, "
          f"taps window {a.taps_window or 'off'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
