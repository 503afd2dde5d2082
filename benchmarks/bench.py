"""Time our KDA kernels and, when importable, fla's ``chunk_kda`` in the same process.

    python benchmarks/bench.py [--shapes dense,varlen] [--heads 16 32] [--seqlens 4096 16384 65536]
                               [--peer fla|none] [--json FILE] [--taps-window 64]

Inputs follow the peer benchmark (``shared/peer/peer_fla.py``): bf16 q/k/v (q, k L2-normalised
outside the timed region), fp32 pre-gated natural-log decay ``g = logsigmoid(randn) / 16``,
``beta = sigmoid(randn)`` in bf16, D = K = V = 128, B = 1, chunk 64, no in-kernel gate, l2norm or
sigmoid. "fwd" is the training forward (inputs require grad); "fwd+bwd" adds
``torch.autograd.grad`` w.r.t. every input. Ours runs with ``precision="bf16"``.
Times are ``triton.testing.do_bench`` medians (ms) after a warm-up; the table gives ours/fla ratios.
With ``--taps-window N`` ours is also timed with every tap on for chunks [0, N) and all heads
(``taps_ratio``), and so again with the taps then read in the registry layout (``taps_read_ratio``:
the aliased taps' views or gathers, ``kernels/common.py`` ALIAS_TAPS, count there).
First-call (compile + autotune) times and peak GPU memory are recorded too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

MIXED6 = [2600, 1094, 4096, 1926, 542, 6126]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="dense,varlen", help="comma list of dense, varlen, timed in this order")
    p.add_argument("--heads", type=int, nargs="+", default=[16, 32])
    p.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384, 65536])
    p.add_argument("--varlen-heads", type=int, default=32)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--peer", default="fla", choices=["fla", "none"])
    p.add_argument("--taps-window", type=int, default=64, help="chunks of the taps-on timing (0: skip)")
    p.add_argument("--warmup", type=float, default=25.0)
    p.add_argument("--rep", type=float, default=100.0)
    p.add_argument("--json", default=None)
    p.add_argument("--budget-s", type=float, default=480.0, help="start no new shape after this many seconds")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("FLA_FLASH_KDA", "0")
    os.environ.setdefault("FLA_TILELANG", "0")
    import torch
    import triton
    import triton.testing
    from peer_inputs import peer_inputs

    from kdadbg_kernels import chunk as ours
    from kdadbg_kernels.taps import TapSelection

    fla_kda = None
    if args.peer == "fla":
        try:
            from fla.ops.kda import chunk_kda as fla_kda
        except Exception as e:  # noqa: BLE001
            print(f"[bench] fla not importable ({type(e).__name__}: {e}); timing ours only", flush=True)
    dev = torch.device("cuda")
    env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "argv": sys.argv[1:], "fla": bool(fla_kda)}
    shapes = []
    for group in args.shapes.split(","):  # in the order given: the budget may stop the last ones
        if group == "dense":
            shapes += [dict(name=f"dense_H{H}_T{T}", H=H, T=T, lens=None) for H in args.heads for T in args.seqlens]
        elif group == "varlen":
            shapes.append(dict(name=f"varlen_mixed6_H{args.varlen_heads}_T{sum(MIXED6)}", H=args.varlen_heads,
                               T=sum(MIXED6), lens=MIXED6))
        else:
            sys.exit(f"bench: --shapes: expected a comma list of dense, varlen; found {group!r}")

    def inputs(s):
        return peer_inputs(s["T"], s["H"], args.dim, dev, lens=s["lens"])

    def timed(fn):
        return float(triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median"))

    def first_call(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    results = []
    t_start = time.time()
    for s in shapes:
        if time.time() - t_start > args.budget_s:
            results.append({**s, "skipped": f"budget {args.budget_s:.0f}s"})
            continue
        x, cu, do = inputs(s)
        leaves = list(x.values())
        rec = dict(s)

        cu_cpu = cu.cpu() if cu is not None else None  # both get the host offsets fla's API takes

        def our_call(taps=None):
            return ours.chunk_kda(**x, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu, chunk_size=args.chunk_size,
                                  use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, precision="bf16",
                                  taps=taps)

        def our_fwd(taps=None):
            return our_call(taps)[0]

        def our_fwdbwd(taps=None):
            return torch.autograd.grad(our_fwd(taps), leaves, do)

        def our_fwdbwd_read(taps):  # and every tap read in the registry layout (aliased taps: views or gathers)
            o, _, plan = our_call(taps)
            return torch.autograd.grad(o, leaves, do), plan.buffers

        runs = [("ours", our_fwd, our_fwdbwd)]
        if fla_kda is not None:
            kw = dict(cu_seqlens=cu, chunk_size=args.chunk_size)
            if cu is not None:
                kw["cu_seqlens_cpu"] = cu_cpu

            def fla_fwd():
                return fla_kda(**x, **kw)[0]

            def fla_fwdbwd():
                return torch.autograd.grad(fla_fwd(), leaves, do)

            runs.append(("fla", fla_fwd, fla_fwdbwd))
        for tag, fwd, fwdbwd in runs:
            try:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                rec[f"{tag}_first_call_s"] = round(first_call(fwdbwd), 2)
                rec[f"{tag}_peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
                rec[f"{tag}_fwd_ms"] = timed(fwd)
                rec[f"{tag}_fwdbwd_ms"] = timed(fwdbwd)
            except Exception as e:  # noqa: BLE001
                rec[f"{tag}_error"] = f"{type(e).__name__}: {e}"[:500]
                print(f"[bench] {s['name']} {tag}: {rec[f'{tag}_error']}", flush=True)
        if args.taps_window and "ours_fwdbwd_ms" in rec:
            sel = TapSelection(chunks=(0, args.taps_window))
            rec["ours_taps_fwdbwd_ms"] = timed(lambda: our_fwdbwd(sel))
            rec["taps_ratio"] = rec["ours_taps_fwdbwd_ms"] / rec["ours_fwdbwd_ms"]
            rec["ours_taps_read_fwdbwd_ms"] = timed(lambda: our_fwdbwd_read(sel))
            rec["taps_read_ratio"] = rec["ours_taps_read_fwdbwd_ms"] / rec["ours_fwdbwd_ms"]
        if "fla_fwd_ms" in rec and "ours_fwd_ms" in rec:
            rec["ratio_fwd"] = rec["ours_fwd_ms"] / rec["fla_fwd_ms"]
            rec["ratio_fwdbwd"] = rec["ours_fwdbwd_ms"] / rec["fla_fwdbwd_ms"]
        results.append(rec)
        print("[bench] " + json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                                        for k, v in rec.items() if k != "lens"}), flush=True)
        if args.json:
            _write(args.json, env, results)
    if args.json:
        _write(args.json, env, results)
    _table(results)
    return 0


def _write(path, env, results):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"schema": 1, "env": env, "results": results}, f, indent=2)
    os.replace(tmp, path)


def _table(results):
    def f(x):
        return "-" if x is None else f"{x:.3f}"

    hdr = f"{'shape':<28} {'ours fwd':>9} {'fla fwd':>9} {'ratio':>6} {'ours f+b':>9} {'fla f+b':>9} {'ratio':>6} " \
          f"{'taps':>6} {'+read':>6} {'mem ours':>9} {'mem fla':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        print(f"{r['name']:<28} {f(r.get('ours_fwd_ms')):>9} {f(r.get('fla_fwd_ms')):>9} {f(r.get('ratio_fwd')):>6} "
              f"{f(r.get('ours_fwdbwd_ms')):>9} {f(r.get('fla_fwdbwd_ms')):>9} {f(r.get('ratio_fwdbwd')):>6} "
              f"{f(r.get('taps_ratio')):>6} {f(r.get('taps_read_ratio')):>6} {f(r.get('ours_peak_mem_gib')):>9} "
              f"{f(r.get('fla_peak_mem_gib')):>8}")


if __name__ == "__main__":
    sys.exit(main())
