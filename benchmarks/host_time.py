"""The host's own time per call of our ``chunk_kda``, measured without a GPU: what our wrapper code costs.

    python benchmarks/host_time.py [--H 16] [--T 8192] [--settings pregated,softplus,lower_bound]
                                   [--taps-window 0,64] [--iters 200] [--profile N] [--launch stub|triton]

Where a call is short (H16 T8192: about 2 ms of kernels), the GPU can wait on the host, which launches the
kernels and runs our Python around them; ``kernel_profile.py`` says on the GPU whether it does. This script
isolates the part that is ours: it runs ``bench.py``'s timed call (forward + ``torch.autograd.grad``, the
flags users pass per setting, chunk 64, bf16 mode) on ``meta`` tensors (shapes only: no memory, no
arithmetic) with every Triton launch replaced by a call that does nothing, and reports per forward +
backward the host's time (median over ``--iters`` calls), how many kernel launches were asked for, and the
torch operations issued (counted by a dispatch mode in one further call, e.g. ``empty``, ``fill_``).
``--profile N``: the N functions with the most time of their own (cProfile) over the calls of the last
setting.

``--launch stub`` (the default) leaves Triton's launch cost out. ``--launch triton`` puts Triton's own
Python launch path in: ``JITFunction.run`` with its argument binding, specialisation and cache lookup,
under a stand-in CUDA driver (an sm_90 target; compiling replaced by a stand-in kernel whose launch reads
each tensor argument's ``data_ptr``, as Triton's C launcher does, and launches nothing). What is still
left out: the C launcher's argument packing and the driver's ``cuLaunchKernel``. The stand-in leans on
Triton's internals (``triton.runtime.driver.set_active``, ``JITFunction._do_compile``), tried with Triton
3.6 (the GPU machine's) and 3.9; the difference of the two modes in one run is Triton's share.

Every figure is this machine's: compare variants in one run, not across machines.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--settings", default="pregated,softplus,lower_bound")
    ap.add_argument("--taps-window", default="0,64", help="comma list: 0 for taps off, N for every tap on "
                    "over chunks [0, N) (bench.py's taps-on call)")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    ap.add_argument("--launch", choices=("stub", "triton"), default="stub",
                    help="stub: every launch does nothing; triton: Triton's own launch path under a stand-in "
                         "CUDA driver, up to its C launcher")
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("TRITON_INTERPRET=1 is set: unset it (the launches are stubbed here, nothing is interpreted)")
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime.jit import JITFunction

    sys.path.insert(0, os.path.dirname(__file__))
    from peer_inputs import SETTINGS, setting_inputs
    from kdadbg_kernels.chunk import chunk_kda
    from kdadbg_kernels.taps import TapSelection

    launches = collections.Counter()

    def stub(self, grid):
        def launch(*args, **kwargs):
            launches[self.__name__] += 1
        return launch

    if a.launch == "stub":
        JITFunction.__getitem__ = stub
    else:
        stand_in_driver(launches)

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.__name__.split(".")[0]] += 1
            return func(*args, **(kwargs or {}))

    rows, step = [], None
    for setting in a.settings.split(","):
        x, _, do = setting_inputs(setting, a.T, a.H, a.D, "cpu")
        x = {n: t.detach().to("meta").requires_grad_() for n, t in x.items()}
        do, leaves = do.to("meta"), list(x.values())
        for tw in (int(w) for w in a.taps_window.split(",")):
            taps = TapSelection(chunks=(0, tw)) if tw else None

            def step(x=x, do=do, leaves=leaves, taps=taps, flags=SETTINGS[setting]):
                o = chunk_kda(**x, **flags, chunk_size=64, precision="bf16", taps=taps)[0]
                torch.autograd.grad(o, leaves, do)

            for _ in range(5):
                step()
            times = []
            for _ in range(a.iters):
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
            launches.clear()
            with Ops() as ops:
                step()
            n_launch = sum(launches.values())
            row = dict(setting=setting, taps_window=tw, ms=statistics.median(times) * 1e3, launches=n_launch,
                       ops=dict(ops.ops.most_common()))
            rows.append(row)
            op_text = ", ".join(f"{k} {v}" for k, v in row["ops"].items() if k not in ("view", "_unsafe_view"))
            print(f"{setting} H{a.H} T{a.T} taps window {tw}: host {row['ms']:.3f} ms per forward + backward "
                  f"(median of {a.iters}), {n_launch} kernel launches; torch ops: {op_text}", flush=True)
    if a.profile and step is not None:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.iters):
            step()
        pr.disable()
        pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(a.profile)
    return rows


def stand_in_driver(launches) -> None:
    """Triton's launch path without a GPU: an sm_90 CUDA target as the active driver, and each kernel's first
    launch of a specialisation given a stand-in compiled kernel (no compiler) whose ``run`` reads every
    tensor argument's ``data_ptr`` and counts the launch."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    class Driver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self):
            return torch.device("meta")

    class Kernel:
        function, packed_metadata = 0, None

        def __init__(self, name):
            self.name = name

        def launch_metadata(self, grid, stream, *args):
            return None

        def run(self, grid_0, grid_1, grid_2, stream, function, packed, meta, enter, exit_, *args):
            for x in args:
                if isinstance(x, torch.Tensor):
                    x.data_ptr()
            launches[self.name] += 1

    def compile_stand_in(self, key, signature, device, constexprs, options, attrs, warmup):
        kernel = Kernel(self.__name__)
        self.device_caches[device][0][key] = kernel
        return kernel

    driver.set_active(Driver())
    JITFunction._do_compile = compile_stand_in


if __name__ == "__main__":
    main()
