"""Whether the state passes overlap with the kernels parallel over chunks when launched on two CUDA streams.

    python benchmarks/overlap_probe.py [--H 32] [--T 16384] [--settings lower_bound,pregated]

For each setting: the forward's prepare (token, intra, WY kernels) and its state pass, each alone, then
both at once on two streams (the state pass on the prepared tensors of an earlier call, the prepare writing
fresh ones); likewise the backward's reverse state pass and its V and K passes. Times are CUDA-event
means over ``--reps`` calls after warm-up. If "both" is near the larger of the two alone, the state pass's
few programs leave room for the other kernels, and pipelining the chunks in parts would hide it.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--H", type=int, default=32)
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--settings", default="lower_bound,pregated")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test under TRITON_INTERPRET=1 (no times)")
    a = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(__file__))
    from devices import SMOKE, use_device

    use_device("overlap_probe.py", a.device, cpu=SMOKE)
    import torch
    from peer_inputs import SETTINGS, setting_inputs
    from kdadbg.capturing import call_config
    from kdadbg_kernels.prepare import kda_fwd_prepare
    from kdadbg_kernels.recurrence import kda_fwd_recurrence
    from kdadbg_kernels.recurrence_bwd import chunk_bwd_prep, recurrence_bwd
    from kdadbg_kernels.prepare_bwd import chunk_bwd_dqkg
    from kdadbg_kernels.common import KernelChunks, udu_bf16

    def timed(fn, reps=a.reps):
        if a.device == "cpu":
            fn()
            return 0.0
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / reps

    s1, s2 = (torch.cuda.Stream(), torch.cuda.Stream()) if a.device == "cuda" else (None, None)

    def both(f1, f2):
        def run():
            if s1 is None:
                return f1(), f2()
            cur = torch.cuda.current_stream()
            s1.wait_stream(cur)
            s2.wait_stream(cur)
            with torch.cuda.stream(s1):
                f1()
            with torch.cuda.stream(s2):
                f2()
            cur.wait_stream(s1)
            cur.wait_stream(s2)
        return run

    for setting in a.settings.split(","):
        x, cu, do = setting_inputs(setting, a.T, a.H, 128 if a.device == "cuda" else 32, a.device)
        fl = SETTINGS[setting]
        B, T, H, K = x["q"].shape
        V = x["v"].shape[-1]
        cfg = call_config(fl.get, x["q"], x["v"])  # fla's flags -> our gate, l2norm, beta sigmoid, scale
        print(f"{setting}: H{H} T{T}, gate {cfg.gate}", flush=True)
        scale, gate, lower_bound = cfg.scale, cfg.gate, cfg.lower_bound
        chunks = KernelChunks.build(B, T, None, 64, x["q"].device)
        q, k, g = (x[n].reshape(B * T, H, K).contiguous() for n in ("q", "k", "g"))
        v = x["v"].reshape(B * T, H, V).contiguous()
        beta = x["beta"].reshape(B * T, H).contiguous()
        A_log = x["A_log"].reshape(H).float().contiguous() if "A_log" in x else None
        dt = x["dt_bias"].reshape(H, K).float().contiguous() if "dt_bias" in x else None
        popts = dict(scale=scale, gate=gate, lower_bound=lower_bound, qk_l2norm=cfg.qk_l2norm,
                     beta_sigmoid=cfg.beta_sigmoid, A_log=A_log, dt_bias=dt, precision="bf16")

        def prep():
            return kda_fwd_prepare(q, k, v, g, beta, chunks, **popts, store_qd=True)
        P = prep()
        qn, kn, gc, krT, b, w, u, gT, INV, Mqk, qd, rq, rk = P

        def rec():
            return kda_fwd_recurrence(krT, gT, w, u, None, chunks, precision="bf16", qd=qd, Mqk=Mqk,
                                      out_dtype=torch.bfloat16)
        S, U, ht, o = rec()
        t_p, t_r, t_b = timed(prep), timed(rec), timed(both(rec, prep))
        if a.device == "cpu":
            print("  fwd: prepare, state pass and both ran under the interpreter; nothing timed", flush=True)
        else:
            print(f"  fwd: prepare {t_p:.3f} ms, state pass {t_r:.3f}, sum {t_p + t_r:.3f}, both on two streams "
                  f"{t_b:.3f} (hidden {t_p + t_r - t_b:.3f})", flush=True)
        dof = do.reshape(B * T, H, V).contiguous()
        qd2, kr, w2, dU0 = chunk_bwd_prep(qn, kn, gc, gT, b, INV, Mqk, dof, chunks, scale=scale, precision="bf16",
                                          rq=rq, rk=rk, qd=qd)
        # the completed dU as the op stores it: bf16 beside dU0 (common.udu_bf16), or dU0 completed in place (a
        # copy per call, so that every call starts from dU0)
        dU = torch.empty_like(dU0, dtype=torch.bfloat16) if udu_bf16("bf16") else None

        def brec():
            if dU is None:
                return recurrence_bwd(qd2, kr, w2, dof, dU0.clone(), gT, None, chunks, has_h0=False, precision="bf16")
            return recurrence_bwd(qd2, kr, w2, dof, dU0, gT, None, chunks, has_h0=False, precision="bf16", dU_out=dU)
        dSn, _ = brec()

        def vk():
            return chunk_bwd_dqkg(qn, kn, gc, gT, b, INV, S, dSn, U, dU0 if dU is None else dU, v, dof, g, A_log, dt,
                                  chunks, scale=scale,
                                  gate=gate, lower_bound=lower_bound, precision="bf16", rq=rq, rk=rk)
        t_s, t_vk, t_b = timed(brec), timed(vk), timed(both(brec, vk))
        if a.device == "cpu":
            print("  bwd: reverse state pass, V and K passes and both ran under the interpreter; nothing timed",
                  flush=True)
        else:
            print(f"  bwd: reverse state pass {t_s:.3f} ms, V and K passes {t_vk:.3f}, sum {t_s + t_vk:.3f}, both "
                  f"{t_b:.3f} (hidden {t_s + t_vk - t_b:.3f})", flush=True)


if __name__ == "__main__":
    main()
