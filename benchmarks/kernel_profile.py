"""Where the time goes: CUDA time per kernel of our forward and forward+backward (torch.profiler), one shape.

    python benchmarks/kernel_profile.py [--H 16] [--T 16384] [--D 128] [--chunk-size 64] [--precision bf16]
                                 [--iters 5] [--varlen] [--settings pregated,softplus,lower_bound]
                                 [--ab KDADBG_NAME=value ...] [--taps-window N] [--peer fla] [--host-profile N]
                                 [--json FILE]

Inputs as ``benchmarks/bench.py``, in each of ``--settings`` (default ``pregated``: bf16 q/k/v, fp32
log-decay, no in-kernel gate/l2norm/sigmoid; ``softplus``, ``lower_bound``: raw inputs with the gate,
l2norm and beta sigmoid in the kernel, ``peer_inputs.SETTINGS``); ``--ab`` adds a run with knob overrides
in each setting, unless every knob it sets is one the defaults already read with that value there, or one they
do not read (``peer_inputs.variant_effect``): such a run would time the defaults again, so it is said and
skipped (``repeats_defaults`` in the JSON). After two calls (compilation), ``--iters`` forwards and then ``--iters``
forward+backward calls are profiled; the tables give each kernel's mean CUDA time per call (forward+
backward) and its share of the total kernel time, beside the wall time of a forward and a forward+backward
(``do_bench`` medians) and the host's time per call (the calls enqueued without waiting): where the wall time
exceeds the kernel time and the host's time nears the wall time, the host (launches, Python, synchronising
copies) is the bound; ``--host-profile N`` names where the host's time goes (cProfile, the N functions with
the most time of their own). With more than one setting or variant, two closing tables (forward;
forward+backward) compare them kernel by kernel. ``--varlen``: ``bench.py``'s varlen batch of six sequences
(``--T`` is then their total, 16384). ``--taps-window N``: every tap on for chunks [0, N) and all heads (as
``bench.py``'s taps-on timing), so the table shows where the taps' extra time goes: the tap-storing kernel
variants, the NaN fills of the buffers.
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
    ap.add_argument("--settings", default="pregated",
                    help="comma list of input settings (peer_inputs.SETTINGS: pregated, softplus, lower_bound), "
                         "each profiled in turn, then compared kernel by kernel")
    ap.add_argument("--ab", action="append", default=[], metavar="KDADBG_NAME=value[,...]",
                    help="also profile ours with these knob overrides, in every setting of --settings "
                         "(repeatable: one variant each)")
    ap.add_argument("--taps-window", type=int, default=0, help="every tap on for chunks [0, N) (0: taps off)")
    ap.add_argument("--peer", default="ours", choices=["ours", "fla"],
                    help="whose chunk_kda to profile (fla: fla-core's, importable as fla)")
    ap.add_argument("--per-launch", action="store_true",
                    help="also a row per launch in call order (a kernel launched over the tap window and "
                         "over the chunks outside it shows as two rows)")
    ap.add_argument("--host-profile", type=int, default=0, metavar="N",
                    help="also profile the host (cProfile) over --iters forward+backward calls: the N functions "
                         "with the most time of their own")
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test under TRITON_INTERPRET=1 (no CUDA times)")
    a = ap.parse_args(argv)
    from devices import SMOKE, use_device

    use_device("kernel_profile.py", a.device, cpu=SMOKE)
    if a.peer == "fla" and (a.taps_window or a.precision != "bf16" or a.chunk_size != 64 or a.ab):
        ap.error("--peer fla: fla has no taps or knobs, runs bf16 inputs as they are, and is timed at chunk 64")
    import os

    os.environ.setdefault("FLA_FLASH_KDA", "0")
    import torch
    from bench import MIXED6
    from peer_inputs import FLA_ONLY, SETTINGS, knob_env, parse_variant, setting_inputs, variant_effect

    from kdadbg_kernels.tuning import record_reads

    settings = [s for s in a.settings.split(",") if s]
    bad = [s for s in settings if s not in SETTINGS]
    if bad:
        ap.error(f"--settings: expected a comma list of {', '.join(SETTINGS)}, found {', '.join(bad)}")
    try:
        variants = [parse_variant(v) for v in a.ab]
    except ValueError as e:
        ap.error(str(e))
    T, H, D = (sum(MIXED6) if a.varlen else a.T), a.H, a.D
    profiles, failed, repeats = [], [], []
    for setting in settings:
        reads = {}
        for variant in [{}] + variants:
            tag = setting + "".join(f" {n.removeprefix('KDADBG_')}={v}" for n, v in variant.items())
            # a variant whose every knob the defaults already read so (or never read) times the defaults again
            why = variant_effect(variant, reads) if variant else None
            if why:
                print(f"{a.peer} [{tag}]: not timed: {why}")
                repeats.append({"setting": setting, "variant": variant, "tag": tag, "why": why})
                continue
            x, cu, do = setting_inputs(setting, T, H, D, torch.device(a.device), lens=MIXED6 if a.varlen else None)
            try:
                with knob_env(variant), record_reads() as seen:
                    prof = profile_one(a, x, cu, do, SETTINGS[setting], FLA_ONLY.get(setting, {}))
                if not variant:
                    reads = seen
            except Exception as e:  # e.g. a variant out of shared memory: say so, and time the others
                if not variant:
                    raise
                print(f"{a.peer} [{tag}]: failed, not timed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
                failed.append({"setting": setting, "variant": variant, "tag": tag,
                               "error": f"{type(e).__name__}: {e}"[:500]})
                del x, cu, do
                if a.device == "cuda":
                    torch.cuda.empty_cache()
                continue
            prof = {"setting": setting, "variant": variant, "tag": tag, **prof}
            profiles.append(prof)
            kernel_time = (f"kernel time per fwd {prof['total_fwd_ms']:.3f} ms, per fwd+bwd {prof['total_ms']:.3f} ms"
                           if a.device == "cuda" else "no kernel time (a CPU smoke test: the interpreter's times)")
            print(f"{a.peer} [{tag}]: H={H} T={T} D={D} C={a.chunk_size} precision={a.precision} "
                  f"varlen={a.varlen} taps_window={a.taps_window}: first call {prof['first_call_s']:.1f} s, "
                  f"{kernel_time}; "
                  f"wall fwd {prof['wall_ms']['fwd']:.3f} ms, fwd+bwd {prof['wall_ms']['fwdbwd']:.3f} ms; "
                  f"host fwd {prof['host_ms']['fwd']:.3f} ms, fwd+bwd {prof['host_ms']['fwdbwd']:.3f} ms")
            if prof.get("host_profile"):
                print(prof["host_profile"])
            if prof["kernels"]:
                print(f"{'kernel':<60} {'ms/call':>8} {'share':>6} {'launches':>8}")
            for k in prof["kernels"]:
                print(f"{k['name'][:60]:<60} {k['ms']:8.3f} {k['ms'] / prof['total_ms']:6.1%} {k['launches']:8d}")
            if prof["launches"]:
                print(f"{'#':>3} {'launch, in call order':<60} {'ms/call':>8}")
                for i, k in enumerate(prof["launches"]):
                    print(f"{i:3d} {k['name'][:60]:<60} {k['ms']:8.3f}")
            del x, cu, do
            if a.device == "cuda":
                torch.cuda.empty_cache()
    if len(profiles) > 1:
        for what, key in (("forward", "kernels_fwd"), ("forward+backward", "kernels")):
            compare(profiles, key, what)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shape": vars(a), "profiles": profiles, "failed": failed, "repeats_defaults": repeats}, f,
                      indent=2)
    return 1 if failed else 0


def profile_one(a, x, cu, do, flags, fla_only) -> dict:
    """One setting's forward and forward+backward under torch.profiler (after two calls that compile),
    with the wall times beside."""
    import torch
    import triton.testing
    from torch.profiler import ProfilerActivity, profile

    from kdadbg_kernels.chunk import chunk_kda
    from kdadbg_kernels.taps import TapSelection

    cu_cpu = cu.cpu() if cu is not None else None
    varlen = dict(cu_seqlens=cu, cu_seqlens_cpu=cu_cpu) if cu is not None else {}
    taps = TapSelection(chunks=(0, a.taps_window)) if a.taps_window else None
    if a.peer == "fla":
        from fla.ops.kda import chunk_kda as fla_kda

        def fwd():
            return fla_kda(**x, **flags, **fla_only, **varlen, chunk_size=64)[0]
    else:
        def fwd():
            return chunk_kda(**x, **flags, **varlen, chunk_size=a.chunk_size, precision=a.precision, taps=taps)[0]

    leaves = list(x.values())
    cuda = a.device == "cuda"

    def step():
        return torch.autograd.grad(fwd(), leaves, do)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def wall(fn):
        if cuda:
            return triton.testing.do_bench(fn, return_mode="median")
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    t0 = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t0
    step()
    sync()
    out = {"first_call_s": first}
    for key, fn in (("kernels_fwd", fwd), ("kernels", step)):
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            for _ in range(a.iters):
                fn()
            sync()
        per = defaultdict(float)
        calls = defaultdict(int)
        for ev in prof.key_averages():
            t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            if t:
                per[ev.key] += t / a.iters / 1000.0
                calls[ev.key] += ev.count // a.iters
        out[key] = [{"name": n, "ms": ms, "launches": calls[n]} for n, ms in sorted(per.items(), key=lambda kv: -kv[1])]
        out["total_fwd_ms" if key == "kernels_fwd" else "total_ms"] = sum(per.values())
        if key == "kernels":
            seq = per_launch(prof.events(), a.iters, "CUDA" if cuda else "CPU") if a.per_launch else []
            out["launches"] = [{"name": n, "ms": ms} for n, ms in seq]
    out["wall_ms"] = {"fwd": wall(fwd), "fwdbwd": wall(step)}
    out["host_ms"] = {"fwd": host(fwd, a.iters, sync), "fwdbwd": host(step, a.iters, sync)}
    if a.host_profile:
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.iters):
            step()
        prof.disable()
        sync()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(a.host_profile)
        out["host_profile"] = text.getvalue()
    return out


def host(fn, iters: int, sync) -> float:
    """The host's time per call of ``fn`` (ms): the calls enqueued back to back without waiting for the GPU,
    the mean of ``iters``, after a sync. Near the wall time, the host is the bound (launches, Python)."""
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    host_s = time.perf_counter() - t
    sync()
    return host_s / iters * 1e3


def compare(profiles, key, what):
    """Kernel by kernel, ms per call in each profile, the first as the baseline (kernels absent there or
    in another show "-"), and the totals."""
    names = []
    for p in profiles:
        names += [k["name"] for k in p[key] if k["name"] not in names]
    ms = [{k["name"]: k["ms"] for k in p[key]} for p in profiles]
    names.sort(key=lambda n: -max(m.get(n, 0.0) for m in ms))
    tags = [p["tag"][:22] for p in profiles]
    print(f"\n{what}, kernel time per call (ms) by setting")
    print(f"{'kernel':<52} " + " ".join(f"{t:>22}" for t in tags))
    for n in names:
        print(f"{n[:52]:<52} " + " ".join(f"{m[n]:22.3f}" if n in m else f"{'-':>22}" for m in ms))
    total = "total_fwd_ms" if key == "kernels_fwd" else "total_ms"
    if names:  # no kernel rows (a CPU smoke test): no total either, rather than a total of 0
        print(f"{'total':<52} " + " ".join(f"{p[total]:22.3f}" for p in profiles))
    wall = "fwd" if key == "kernels_fwd" else "fwdbwd"
    print(f"{'wall (do_bench median)':<52} " + " ".join(f"{p['wall_ms'][wall]:22.3f}" for p in profiles))


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
