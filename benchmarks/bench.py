"""Time our KDA kernels beside fla's ``chunk_kda`` and FlashKDA, in one process, in three input settings.

    python benchmarks/bench.py [--settings pregated,softplus,lower_bound] [--shapes NAME ...]
                               [--peers fla,flashkda] [--budget-s 400] [--ab KDADBG_NAME=value ...]
                               [--taps-at SETTING:SHAPE ...] [--write-docs] [--json FILE] [--commit SHA]
                               [--dry-run]

Settings (``benchmarks/peer_inputs.py`` ``SETTINGS``), each called with the flags users pass:
- ``pregated``: the peer benchmark's inputs (bf16 q/k/v, q and k L2-normalised outside, fp32 log-decay
  ``g = logsigmoid(randn) / 16``, ``beta = sigmoid(randn)``), no in-kernel gate, l2norm or sigmoid;
- ``softplus``: fla's ``KimiDeltaAttention``: raw bf16 q, k, v, gate and beta logits with
  ``use_gate_in_kernel``, ``use_qk_l2norm_in_kernel``, ``use_beta_sigmoid_in_kernel``, ``A_log [H]`` and
  ``dt_bias [H*K]`` (fp32, the layer's initialisation), gate ``-exp(A_log) softplus(g + dt_bias)``;
- ``lower_bound``: Kimi/FlashKDA: as softplus with ``lower_bound=-5`` (gate ``-5 sigmoid(exp(A_log)
  (g + dt_bias))``), fla also with ``safe_gate=True``.
D = K = V = 128, B = 1, chunk 64. Ours is ``kdadbg_kernels.chunk.chunk_kda`` (the autograd op) with
``precision="bf16"``; fla is fla-core's ``chunk_kda`` with ``FLA_FLASH_KDA=0``; FlashKDA (lower_bound
only, when ``flash_kda`` is importable: ``benchmarks/build_flashkda.sh``) is timed through
``flash_kda.fwd`` (forward) and, for the fork, ``flash_kda.autograd.flash_kda_func`` (forward+backward);
against FlashKDA's forward ours is also timed at chunk 16 (``--flashkda-chunks``) and the ratio takes
our best; ``ours_infer`` (``ours_infer_c16`` at chunk 16) is our forward under ``torch.no_grad`` (an
inference forward, as FlashKDA's is: nothing kept for a backward, so the state pass stores no per-chunk
``S``, ``U``, nor, with the l2norm in the kernel, ``qn, kn``: row scales instead), ratio
``ours_infer/flashkda_fwd`` of our better chunk;
with ``--ab`` in the lower-bound setting it is timed at each variant too, at each chunk
(``ours_infer@NAME=value``, ``ours_infer_c16@NAME=value``; no ratio).

"fwd" is the training forward (inputs require grad); "fwd+bwd" adds ``torch.autograd.grad`` w.r.t.
every input (``A_log``, ``dt_bias`` included). Times are ``triton.testing.do_bench`` medians (ms).
Per run: the first call (compile, autotune) in seconds and the peak GPU memory of a fwd+bwd (GiB,
inputs included). ``--ab KDADBG_NAME=value[,...]`` times ours again with those knob overrides
(``kernels/tuning.py``) in the same process, as a run of its own (``ours@NAME=value``).
``--taps-at SETTING:SHAPE``: ours with every tap on for chunks [0, ``--taps-window``) against taps
off, ``--taps-repeats`` separate off/on pairs (``taps_ratios``).

Configurations run shape by shape in the order given (the default puts H16/H32 T16384 and H64 T8192
first), each setting in turn; after ``--budget-s`` seconds no new one starts (those left are recorded
as skipped). Each run is isolated: an error (OOM, a peer's failure) is recorded and the next runs.
The JSON (``--json FILE``, and ``docs/benchmarks.json`` with ``--write-docs``) is rewritten after every
run, so a time-out keeps what finished: commit, date, versions, GPU, the command and every result.
``--dry-run`` lists the configurations and exits (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS_JSON = REPO / "docs" / "benchmarks.json"
MIXED6 = [2600, 1094, 4096, 1926, 542, 6126]
SETTING_NAMES = ("pregated", "softplus", "lower_bound")
# most important first: the budget may stop the last ones
DEFAULT_SHAPES = ["dense_H16_T16384", "dense_H32_T16384", "dense_H64_T8192", "varlen_mixed6_H32",
                  "dense_H16_T8192", "dense_H32_T8192", "dense_H16_T65536", "dense_H32_T65536",
                  "dense_H64_T16384", "dense_H64_T65536"]
DEFAULT_TAPS_AT = ["pregated:dense_H16_T16384", "lower_bound:dense_H32_T16384"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", default=",".join(SETTING_NAMES), help="comma list of " + ", ".join(SETTING_NAMES))
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES,
                   help="dense_H<H>_T<T>, varlen_mixed6_H<H> (six sequences, 16384 tokens) or varlen_lens<n>-<n>..._H<H>, "
                        "in timing order")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--peers", default="fla,flashkda", help="comma list of fla, flashkda (or none)")
    p.add_argument("--flashkda-chunks", type=int, nargs="*", default=[16],
                   help="our other chunk sizes timed (forward) against FlashKDA's forward")
    p.add_argument("--ab", action="append", default=[], metavar="KDADBG_NAME=value[,...]",
                   help="also time ours with these knob overrides (repeatable: one variant each); a variant whose "
                        "every knob the run beside it read with that value, or did not read, is said and not timed")
    p.add_argument("--ab-settings", default="softplus,lower_bound",
                   help="settings the --ab variants run in (default: the in-kernel ones)")
    p.add_argument("--taps-at", nargs="*", default=None, metavar="SETTING:SHAPE",
                   help="configurations that also time the taps-on ratio, each among --settings x --shapes "
                        f"(default: those of {' '.join(DEFAULT_TAPS_AT)} that are; none with a bare --taps-at)")
    p.add_argument("--taps-window", type=int, default=64, help="chunks of the taps-on timing")
    p.add_argument("--taps-repeats", type=int, default=3, help="separate taps-off/taps-on pairs")
    p.add_argument("--warmup", type=float, default=25.0)
    p.add_argument("--rep", type=float, default=100.0)
    p.add_argument("--budget-s", type=float, default=400.0, help="start no new configuration after this")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--write-docs", action="store_true", help=f"write the results to {DOCS_JSON.relative_to(REPO)}")
    p.add_argument("--commit", default=os.environ.get("KDADBG_BENCH_COMMIT"),
                   help="the commit timed (default: git rev-parse HEAD, or $KDADBG_BENCH_COMMIT)")
    p.add_argument("--dry-run", action="store_true", help="list the configurations and exit")
    p.add_argument("--device", default="cuda",
                   help="cuda; or cpu for a smoke test under TRITON_INTERPRET=1 at tiny shapes (one call per "
                        "timing, wall clock, no memory figures)")
    a = p.parse_args(argv)
    a.settings = [s for s in a.settings.split(",") if s]
    a.ab_settings = [s for s in a.ab_settings.split(",") if s]
    a.peers = [s for s in a.peers.split(",") if s and s != "none"]
    for s in a.settings + a.ab_settings:
        if s not in SETTING_NAMES:
            p.error(f"--settings/--ab-settings: expected {', '.join(SETTING_NAMES)}, found {s!r}")
    for s in a.peers:
        if s not in ("fla", "flashkda"):
            p.error(f"--peers: expected a comma list of fla, flashkda (or none), found {s!r}")
    from peer_inputs import parse_variant
    try:
        a.variants = [parse_variant(v) for v in a.ab]
    except ValueError as e:
        p.error(str(e))
    a.shape_list = []
    for name in a.shapes:
        shape = parse_shape(name)
        if shape is None:
            p.error(f"--shapes: expected dense_H<H>_T<T> or varlen_mixed6_H<H>, found {name!r}")
        a.shape_list.append(shape)
    if a.taps_at is None:  # the default pairs that this run's configurations include
        a.taps_at = [t for t in DEFAULT_TAPS_AT if t.partition(":")[0] in a.settings and t.partition(":")[2] in a.shapes]
    for t in a.taps_at:
        setting, _, shape = t.partition(":")
        if setting not in SETTING_NAMES or parse_shape(shape) is None:
            p.error(f"--taps-at: expected SETTING:SHAPE (e.g. pregated:dense_H16_T16384), found {t!r}")
        if setting not in a.settings or shape not in a.shapes:
            p.error(f"--taps-at {t}: not among the configurations timed (--settings {','.join(a.settings)}, "
                    f"--shapes {' '.join(a.shapes)}); add the setting and the shape, or pass --taps-at with none")
    return a


def parse_shape(name: str):
    m = re.fullmatch(r"dense_H(\d+)_T(\d+)", name)
    if m:
        return dict(shape=name, H=int(m[1]), T=int(m[2]), lens=None)
    m = re.fullmatch(r"varlen_mixed6_H(\d+)", name)
    if m:
        return dict(shape=name, H=int(m[1]), T=sum(MIXED6), lens=MIXED6)
    m = re.fullmatch(r"varlen_lens([\d-]+)_H(\d+)", name)  # e.g. varlen_lens30-70_H2 (small tests)
    if m:
        lens = [int(n) for n in m[1].split("-") if n]
        return dict(shape=name, H=int(m[2]), T=sum(lens), lens=lens) if lens else None
    return None


def variant_tag(variant: dict) -> str:
    return "ours@" + ",".join(f"{n.removeprefix('KDADBG_')}={v}" for n, v in variant.items())


def infer_tag(variant: dict, chunk: int | None = None) -> str:
    """The inference forward's run with ``variant``'s knob overrides (beside FlashKDA), at ``chunk`` when it
    is not the default chunk (``ours_infer_c16@...``)."""
    return variant_tag(variant).replace("ours@", "ours_infer@" if chunk is None else f"ours_infer_c{chunk}@", 1)


def configurations(a) -> list[dict]:
    """Every (shape, setting) in timing order, with the runs each makes."""
    taps_at = set(a.taps_at)
    out = []
    for shape in a.shape_list:
        for setting in a.settings:
            runs = ["ours"] + [variant_tag(v) for v in a.variants if setting in a.ab_settings]
            runs += [p for p in a.peers if p == "fla" or setting == "lower_bound"]
            if "flashkda" in runs:
                other = [c for c in a.flashkda_chunks if c != a.chunk_size]
                runs += [f"ours_c{c}" for c in other] + ["ours_infer"] + [f"ours_infer_c{c}" for c in other]
                runs += [infer_tag(v, c) for v in a.variants if setting in a.ab_settings for c in [None, *other]]
            out.append(dict(name=f"{setting}_{shape['shape']}", setting=setting, **shape, runs=runs,
                            taps=f"{setting}:{shape['shape']}" in taps_at))
    return out


def commit_of(given: str | None) -> str:
    if given:
        return given
    try:
        sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception:  # noqa: BLE001  (a copy of the tree without .git: pass --commit)
        return "unknown (no git here: pass --commit)"


def main(argv=None):
    a = parse_args(argv)
    cfgs = configurations(a)
    if a.dry_run:
        for c in cfgs:
            print(f"{c['name']:<36} H={c['H']:<3} T={c['T']:<6} {'varlen ' if c['lens'] else ''}"
                  f"runs: {', '.join(c['runs'])}{'; taps x' + str(a.taps_repeats) if c['taps'] else ''}")
        print(f"{len(cfgs)} configurations, budget {a.budget_s:.0f} s; "
              f"JSON: {', '.join(p for p in (a.json, a.write_docs and str(DOCS_JSON)) if p) or 'none'}")
        return 0
    from devices import SMOKE, use_device

    use_device("bench.py", a.device, cpu=SMOKE)
    os.environ.setdefault("FLA_FLASH_KDA", "0")
    os.environ.setdefault("FLA_TILELANG", "0")
    import torch
    import triton

    paths = [Path(p) for p in (a.json, a.write_docs and DOCS_JSON) if p]
    env = {"commit": commit_of(a.commit), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "command": " ".join(shlex.quote(x) for x in ["python", *sys.argv]),
           "python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "triton": triton.__version__,
           "gpu": torch.cuda.get_device_name() if a.device == "cuda" else a.device,
           "env": {n: v for n, v in os.environ.items() if n.startswith(("KDADBG_", "FLA_", "TRITON_"))}}
    if a.device != "cuda":  # the smoke test: the interpreter cannot benchmark fla's autotune configs
        from triton.runtime.autotuner import Autotuner
        prune = Autotuner.prune_configs
        Autotuner.prune_configs = lambda self, *args, **kw: prune(self, *args, **kw)[:1]
    peers = load_peers(a.peers, env)
    payload = {"schema": 2, "env": env, "settings": a.settings, "results": []}
    bench = Bench(a, peers, torch, triton)
    t0 = time.time()
    for c in cfgs:
        rec = {k: v for k, v in c.items() if k != "runs"}
        payload["results"].append(rec)
        elapsed = time.time() - t0
        if elapsed > a.budget_s:
            rec["skipped"] = f"budget {a.budget_s:.0f} s reached at {elapsed:.0f} s"
            continue
        bench.config(c, rec, lambda: _write(paths, payload))
        print("[bench] " + _line(rec), flush=True)
        _write(paths, payload)
    payload["wall_s"] = round(time.time() - t0, 1)
    payload["summary"] = summary(payload["results"])
    _write(paths, payload)
    _table(payload["results"])
    print("[bench] summary " + json.dumps(payload["summary"]), flush=True)
    return 0


def load_peers(names, env) -> dict:
    """The importable peers: ``{"fla": chunk_kda, "flashkda": (flash_kda module, fork autograd fn or None)}``;
    what each is (or why not) goes into ``env``."""
    peers = {}
    if "fla" in names:
        try:
            import fla
            from fla.ops.kda import chunk_kda
            peers["fla"] = chunk_kda
            env["fla"] = f"{getattr(fla, '__version__', '?')} ({getattr(fla, '__file__', '?')})"
        except Exception as e:  # noqa: BLE001
            env["fla"] = f"not importable: {type(e).__name__}: {e}"
    if "flashkda" in names:
        try:
            import flash_kda
            try:
                from flash_kda.autograd import flash_kda_func
            except ImportError:
                flash_kda_func = None
            peers["flashkda"] = (flash_kda, flash_kda_func)
            env["flashkda"] = f"{'fork' if flash_kda_func else 'upstream'} ({getattr(flash_kda, '__file__', '?')})"
        except Exception as e:  # noqa: BLE001
            env["flashkda"] = f"not importable: {type(e).__name__}: {e}"
    for n in names:
        print(f"[bench] {n}: {env.get(n)}", flush=True)
    return peers


class Bench:
    """The runs of one configuration; each run's numbers land in ``rec["runs"][tag]``."""

    def __init__(self, a, peers, torch, triton):
        self.a, self.peers, self.torch, self.triton = a, peers, torch, triton
        self.dev = torch.device(a.device)
        self.cuda = self.dev.type == "cuda"

    def timed(self, fn) -> float:
        if not self.cuda:  # the CPU smoke test: one call
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        return float(self.triton.testing.do_bench(fn, warmup=self.a.warmup, rep=self.a.rep, return_mode="median"))

    def free(self):
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()

    def first_and_peak(self, fn) -> tuple[float, float | None]:
        torch = self.torch
        self.free()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        fn()
        if self.cuda:
            torch.cuda.synchronize()
        peak = round(torch.cuda.max_memory_allocated() / 2**30, 3) if self.cuda else None
        return round(time.perf_counter() - t, 2), peak

    def config(self, c, rec, save):
        from peer_inputs import FLA_ONLY, SETTINGS, knob_env, setting_inputs, variant_effect

        from kdadbg_kernels.tuning import record_reads

        torch, a = self.torch, self.a
        rec["runs"] = runs = {}
        try:
            x, cu, do = setting_inputs(c["setting"], c["T"], c["H"], a.dim, self.dev, lens=c["lens"])
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"inputs: {type(e).__name__}: {e}"[:500]
            self.free()
            return
        leaves = list(x.values())
        cu_cpu = cu.cpu() if cu is not None else None
        flags = SETTINGS[c["setting"]]
        varlen = dict(cu_seqlens=cu, cu_seqlens_cpu=cu_cpu) if cu is not None else {}

        def grad(fwd):
            return lambda: torch.autograd.grad(fwd(), leaves, do)

        def ours(chunk=a.chunk_size, taps=None):
            from kdadbg_kernels.chunk import chunk_kda
            return lambda: chunk_kda(**x, **flags, **varlen, chunk_size=chunk, precision="bf16", taps=taps)[0]

        # tag -> (forward, forward+backward or None, knob overrides)
        plan = {"ours": (ours(), grad(ours()), {})}
        if c["setting"] in a.ab_settings:
            plan.update({variant_tag(v): (ours(), grad(ours()), v) for v in a.variants})
        if "fla" in self.peers:
            fla = self.peers["fla"]

            def fla_fwd():
                return fla(**x, **flags, **FLA_ONLY.get(c["setting"], {}), **varlen, chunk_size=a.chunk_size)[0]

            plan["fla"] = (fla_fwd, grad(fla_fwd), {})
        if "flashkda" in self.peers and c["setting"] == "lower_bound":
            try:
                plan["flashkda"] = (*self.flashkda_calls(x, cu, flags["lower_bound"]), {})
            except Exception as e:  # noqa: BLE001
                runs["flashkda"] = {"error": f"{type(e).__name__}: {e}"[:500]}
            plan.update({f"ours_c{chunk}": (ours(chunk), None, {}) for chunk in a.flashkda_chunks
                         if chunk != a.chunk_size})
            def infer(chunk=a.chunk_size):  # FlashKDA's forward is an inference one: ours, no backward to follow
                fwd_train = ours(chunk)

                def run():
                    with torch.no_grad():
                        return fwd_train()
                return run

            plan["ours_infer"] = (infer(), None, {})
            plan.update({f"ours_infer_c{chunk}": (infer(chunk), None, {}) for chunk in a.flashkda_chunks
                         if chunk != a.chunk_size})
            if c["setting"] in a.ab_settings:
                plan.update({infer_tag(v): (infer(), None, v) for v in a.variants})
                plan.update({infer_tag(v, chunk): (infer(chunk), None, v) for v in a.variants
                             for chunk in a.flashkda_chunks if chunk != a.chunk_size})
        reads = {}   # each run without overrides: the knob values its calls read (tuning.record_reads)
        for tag, (fwd, fwdbwd, variant) in plan.items():
            base = tag.partition("@")[0]   # ours@X=1 beside ours, ours_infer@X=1 beside ours_infer
            why = variant_effect(variant, reads[base]) if variant and base in reads else None
            if why:   # it would time its base run again: said, not timed
                runs[tag] = {"skipped": why}
                print(f"[bench] {c['name']} {tag}: not timed: {why}", flush=True)
                continue
            r = runs[tag] = {}
            try:
                with knob_env(variant), record_reads() as seen:
                    r["first_call_s"], r["peak_mem_gib"] = self.first_and_peak(fwdbwd or fwd)
                    r["fwd_ms"] = self.timed(fwd)
                    if fwdbwd is not None:
                        r["fwdbwd_ms"] = self.timed(fwdbwd)
                if not variant:
                    reads[tag] = seen
            except Exception as e:  # noqa: BLE001
                r["error"] = f"{type(e).__name__}: {e}"[:500]
                print(f"[bench] {c['name']} {tag}: {r['error']}", flush=True)
                if "CUDA error" in str(e) or "illegal memory" in str(e):
                    traceback.print_exc()
            self.free()
            save()
        if c["taps"] and "fwdbwd_ms" in runs.get("ours", {}):
            self.taps(rec, grad, ours)
        ratios(rec)
        del x, leaves, do, plan
        self.free()

    def flashkda_calls(self, x, cu, lower_bound):
        """FlashKDA's forward (``flash_kda.fwd``, out and workspace allocated per call as ours allocates
        its outputs) and, for the fork, forward+backward through ``flash_kda_func``; its arguments from
        the same leaves (``dt_bias`` as ``[H, K]``)."""
        torch = self.torch
        flash_kda, flash_kda_func = self.peers["flashkda"]
        H, K = x["q"].shape[2], x["q"].shape[3]
        scale = K ** -0.5
        cu64 = cu.to(torch.int64) if cu is not None else None
        d = {n: t.detach() for n, t in x.items()}
        dt = d["dt_bias"].view(H, K)

        def fwd():
            out = torch.empty_like(d["v"])
            flash_kda.fwd(d["q"], d["k"], d["v"], d["g"], d["beta"], scale, out, d["A_log"], dt, lower_bound,
                          cu_seqlens=cu64)
            return out

        if flash_kda_func is None:
            return fwd, None
        leaves = list(x.values())
        do = torch.randn_like(d["v"])

        def fwdbwd():
            o, _ = flash_kda_func(x["q"], x["k"], x["v"], x["g"], x["beta"], scale, x["A_log"],
                                  x["dt_bias"].view(H, K), lower_bound, None, False, cu64)
            return torch.autograd.grad(o, leaves, do)

        return fwd, fwdbwd

    def taps(self, rec, grad, ours):
        from kdadbg_kernels.taps import TapSelection

        sel = TapSelection(chunks=(0, self.a.taps_window))
        off, on = grad(ours()), grad(ours(taps=sel))
        try:
            rec["taps_first_call_s"], rec["taps_peak_mem_gib"] = self.first_and_peak(on)
            pairs = [(self.timed(off), self.timed(on)) for _ in range(self.a.taps_repeats)]
            rec["taps_fwdbwd_ms"] = [[round(x, 4) for x in p] for p in pairs]
            rec["taps_ratios"] = [p[1] / p[0] for p in pairs]
        except Exception as e:  # noqa: BLE001
            rec["taps_error"] = f"{type(e).__name__}: {e}"[:500]
            print(f"[bench] {rec['name']} taps: {rec['taps_error']}", flush=True)


def ratios(rec):
    """ours (and each variant) / fla, fwd and fwd+bwd; our best forward / FlashKDA's forward."""
    runs = rec.get("runs", {})
    out = {}
    fk = runs.get("flashkda", {})
    infer = [r["fwd_ms"] for t, r in runs.items() if t.startswith("ours_infer") and "@" not in t and "fwd_ms" in r]
    if "fwd_ms" in fk and "fwd_ms" in runs.get("ours_infer", {}):  # our best chunk, as for the training forward
        out["ours_infer/flashkda_fwd"] = min(infer) / fk["fwd_ms"]
    for tag, r in runs.items():
        if not tag.startswith("ours") or tag.startswith(("ours_c", "ours_infer")):
            continue
        fla = runs.get("fla", {})
        for m in ("fwd", "fwdbwd"):
            if f"{m}_ms" in r and f"{m}_ms" in fla:
                out[f"{tag}/fla_{m}"] = r[f"{m}_ms"] / fla[f"{m}_ms"]
        fk = runs.get("flashkda", {})
        if "fwd_ms" in fk and "fwd_ms" in r:
            best = min([r["fwd_ms"]] + [x["fwd_ms"] for t, x in runs.items() if t.startswith("ours_c") and
                                        "fwd_ms" in x and tag == "ours"])
            out[f"{tag}/flashkda_fwd"] = best / fk["fwd_ms"]
            if "fwdbwd_ms" in fk and "fwdbwd_ms" in r:
                out[f"{tag}/flashkda_fwdbwd"] = r["fwdbwd_ms"] / fk["fwdbwd_ms"]
    rec["ratios"] = out


def summary(results) -> dict:
    """Per setting and ratio, the worst (largest) value over the shapes; the slowest first call."""
    worst, first = {}, {}
    for r in results:
        for name, v in r.get("ratios", {}).items():
            key = f"{r['setting']}:{name}"
            worst[key] = max(worst.get(key, 0.0), v)
        for tag, run in r.get("runs", {}).items():
            if "first_call_s" in run:
                first[tag] = max(first.get(tag, 0.0), run["first_call_s"])
        if r.get("taps_ratios"):
            worst["taps_ratio_max"] = max(worst.get("taps_ratio_max", 0.0), *r["taps_ratios"])
    return {"worst_ratio": {k: round(v, 4) for k, v in worst.items()}, "first_call_s_max": first,
            "skipped": [r["name"] for r in results if "skipped" in r]}


def _write(paths, payload):
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(payload, indent=1, default=str) + "\n")
        os.replace(tmp, path)


def _line(rec) -> str:
    parts = [rec["name"]]
    for tag, r in rec.get("runs", {}).items():
        def f(key, fmt=".3f"):
            return "-" if r.get(key) is None else format(r[key], fmt)

        parts.append(f"{tag} " + (r["error"][:80] if "error" in r else "not timed: " + r["skipped"] if "skipped" in r
                                  else f"fwd {f('fwd_ms')} f+b {f('fwdbwd_ms')} GiB {f('peak_mem_gib', '.2f')} "
                                  f"first {f('first_call_s', '.1f')} s"))
    parts += [f"{k} {v:.3f}" for k, v in rec.get("ratios", {}).items()]
    if rec.get("taps_ratios"):
        parts.append("taps " + "/".join(f"{x:.3f}" for x in rec["taps_ratios"]))
    return " | ".join(parts)


def _table(results):
    def f(x):
        return "-" if x is None else f"{x:.3f}"

    hdr = f"{'configuration':<36} {'run':<24} {'fwd ms':>8} {'f+b ms':>8} {'/fla fwd':>8} {'/fla f+b':>8} " \
          f"{'/fkda fwd':>9} {'GiB':>6} {'first s':>7}"
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        if "skipped" in r or "error" in r:
            print(f"{r['name']:<36} {r.get('skipped') or r.get('error')}")
            continue
        rt = r.get("ratios", {})
        for tag, run in r.get("runs", {}).items():
            if "error" in run or "skipped" in run:
                print(f"{r['name']:<36} {tag:<24} {run.get('error', 'not timed: ' + run.get('skipped', ''))[:60]}")
                continue
            print(f"{r['name']:<36} {tag:<24} {f(run.get('fwd_ms')):>8} {f(run.get('fwdbwd_ms')):>8} "
                  f"{f(rt.get(f'{tag}/fla_fwd')):>8} {f(rt.get(f'{tag}/fla_fwdbwd')):>8} "
                  f"{f(rt.get(f'{tag}/flashkda_fwd')):>9} {f(run.get('peak_mem_gib')):>6} "
                  f"{f(run.get('first_call_s')):>7}")
        if r.get("taps_ratios"):
            print(f"{r['name']:<36} {'taps on / off':<24} " + " ".join(f"{x:.3f}" for x in r["taps_ratios"]))


if __name__ == "__main__":
    sys.exit(main())
