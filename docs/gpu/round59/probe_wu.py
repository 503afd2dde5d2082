"""FWD_FUSE_WU on CUDA: which launch of the fused state pass gives a wrong o or U, or faults.

Parent (no arguments): for each case and knob set, a child process (CUDA_LAUNCH_BLOCKING=1, so a fault
names its kernel and leaves the other children alone) prints one line. Child: ``probe_wu.py CASE``, with
the knobs in its environment: the bf16 forward with FWD_FUSE_WU=0 (the w/u kernel; the judge here) and
FWD_FUSE_WU=1 (the state pass forms U), training (keep_state True: U stored) and inference (keep_state
False); prints o's and U's largest error relative to o's and U's largest magnitude, the first chunk whose
U is off by more than 1e-2 of that magnitude, and that chunk's first bad row.
"""
import os
import subprocess
import sys
import time

DEV = os.environ.get("PROBE_DEVICE", "cuda")
CASES = ("varlen", "kimi_H32_T1024", "kimi_H2_T1024")  # kimi_H<h>_T<t>: any head count and length


def inputs(case):
    import torch
    if case == "varlen":  # the test's chunk64_varlen at two heads at most (H = 1)
        from kdadbg.cases import get_case, make_inputs, with_size
        c = get_case("chunk64_varlen")
        x, cfg = make_inputs(with_size(c, H=min(c.H, 2)))
        x = x.to(DEV)
        h0 = None if x.h0 is None else (x.h0.transpose(-1, -2) if cfg.state_layout == "vk" else x.h0)
        kw = dict(scale=cfg.scale, chunk_size=cfg.chunk_size, gate=cfg.gate, lower_bound=cfg.lower_bound,
                  qk_l2norm=cfg.qk_l2norm, beta_sigmoid=cfg.beta_sigmoid, A_log=x.A_log, dt_bias=x.dt_bias,
                  cu_seqlens=x.cu_seqlens, h0=h0, out_dtype=x.v.dtype)
        return (x.q, x.k, x.v, x.g, x.beta), kw
    H, T = (int(x[1:]) for x in case.split("_")[1:3])
    torch.manual_seed(0)
    q, k, g, v = (torch.randn(1, T, H, 128, device=DEV, dtype=torch.bfloat16) for _ in range(4))
    beta = torch.randn(1, T, H, device=DEV, dtype=torch.bfloat16)
    kw = dict(scale=128 ** -0.5, chunk_size=64, gate="lower_bound", lower_bound=-5.0, A_log=torch.zeros(H, device=DEV),
              dt_bias=torch.zeros(H, 128, device=DEV), out_dtype=torch.bfloat16)
    return (q, k, v, g, beta), kw


def child(case):
    import torch
    from kdadbg_kernels.chunk import kda_forward
    args, kw = inputs(case)
    res = {}
    for fuse in ("0", "1"):
        os.environ["KDADBG_FWD_FUSE_WU"] = fuse
        for keep in (True, False):
            o, ht, saved, chunks = kda_forward(*args, precision="bf16", keep_state=keep, **kw)
            torch.cuda.synchronize() if DEV == "cuda" else None
            res[fuse, keep] = (o.float(), ht.float(), None if saved.U is None else saved.U.float(), chunks)
    o0, ht0, U0, chunks = res["0", True]
    scale_o = o0.abs().max().item()
    scale_u = U0.abs().max().item()
    out = []
    for keep in (True, False):
        o1, ht1, U1, _ = res["1", keep]
        e = (o1 - o0).abs().max().item() / scale_o
        eh = (ht1 - ht0).abs().max().item() / ht0.abs().max().item()
        out.append(f"{'train' if keep else 'infer'} o {e:.2e} ht {eh:.2e} nonfinite {int((~o1.isfinite()).sum())}")
    U1 = res["1", True][2]
    err = (U1 - U0).abs().amax(dim=(1, 2)) / scale_u  # per token
    start, length = chunks.chunk_start.cpu().tolist(), chunks.chunk_len.cpu().tolist()
    bad = [(c, int(r)) for c, (s, n) in enumerate(zip(start, length))
           for r in range(n) if err[s + r] > 1e-2][:1]
    first = f"first bad chunk {bad[0][0]} row {bad[0][1]} of {len(start)}" if bad else f"no bad U row ({len(start)} chunks)"
    print(f"{' | '.join(out)} | U {err.max().item():.2e} {first}", flush=True)


def parent():
    knobsets = [{}, {"REC_INV_AHEAD": "0"}, {"REC_INV_AHEAD": "1"}, {"REC_STAGES": "1"}, {"REC_STAGES": "2"},
                {"REC_STAGES": "1", "REC_INV_AHEAD": "0"}, {"REC_U_AHEAD": "0"}, {"REC_U_AHEAD": "1"},
                {"REC_U_AHEAD": "0", "REC_INV_AHEAD": "0"}, {"REC_U_AHEAD": "0", "REC_INV_AHEAD": "0", "REC_STAGES": "1"},
                {"REC_WARPS": "8"}, {"REC_BV": "32"}, {"REC_BV": "16"}]
    if os.environ.get("PROBE_SETS"):  # "K=V,K=V;K=V": knob sets (without KDADBG_), ";" between sets, "-" the default
        knobsets = [dict(kv.split("=") for kv in ks.split(",") if kv != "-") for ks in os.environ["PROBE_SETS"].split(";")]
    cases = os.environ.get("PROBE_CASES", ",".join(CASES)).split(",")
    limit = float(os.environ.get("LIMIT", "400"))
    t0 = time.time()
    for case in cases:
        for ks in knobsets:
            if time.time() - t0 > limit:
                print("out of time", flush=True)
                return
            env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1", **{f"KDADBG_{k}": v for k, v in ks.items()})
            name = ",".join(f"{k}={v}" for k, v in ks.items()) or "default"
            try:
                p = subprocess.run([sys.executable, __file__, case], env=env, capture_output=True, text=True, timeout=90)
                line = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else \
                    "FAILED " + (p.stderr.strip().splitlines() or ["?"])[-1][:200]
            except subprocess.TimeoutExpired:
                line = "timeout"
            print(f"{case:16s} {name:48s} {line}", flush=True)


if __name__ == "__main__":
    child(sys.argv[1]) if len(sys.argv) > 1 else parent()
