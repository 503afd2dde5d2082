"""Where the forward token kernel's time goes (round 54, an experiment: not part of the kernels): a copy of
314669a's kda_fwd_token_kernel, its bf16 path at chunk 64, with parts switched off by the bits of ABL, each
timed with do_bench on the launch arguments the forward passes the real kernel (captured), lower-bound and
softplus, H32 T16384 (H, T from the environment); then the bytes it moves and a torch copy_ of as many.

ABL bits: 1 no krT store, 2 no cumsum (gc = gamma), 4 no row norms (the first K loop), 8 no qd store, 16 no gc
store, 32 no qn, kn stores, 64 no gate activation, 128 krT stored untransposed (a wrong layout: the cost of the
transpose alone), 256 the programs heads first (grid (H, chunks)). ABLS (comma-separated) picks the variants.
Under TRITON_INTERPRET=1 it checks instead that ABL 0 and ABL 256 write the real kernel's bits.

    python3 docs/gpu/round54/ablate/token_ablate.py                      (ablate2.log)
    ABLS=0,1,2,4,8,16,32,64,128,57,123,66 python3 docs/gpu/round54/ablate/token_ablate.py   (ablate1.log: the
        script before ABL 256, the same kernel copy)
from the repository root with benchmarks/gpu_env.sh sourced."""
import os, sys
os.environ.setdefault("KDADBG_HEADS_FIRST", "0")  # the real kernel on its (chunks, H) grid, as the copy's ABL 0
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import torch, triton, triton.language as tl, triton.testing
import kdadbg_kernels.prepare as P
from kdadbg_kernels.tlmath import exp_, gate_act, round_qk, rsqrt_, sigmoid, store_rn
from peer_inputs import setting_inputs


@triton.jit(do_not_specialize=["tap_lo", "tap_hi", "n_sel", "c0"])
def tok(q, k, g, beta, A_log, dt_bias, qn, kn, rq, rk, gc, krT, qd, b, gT, chunk_start, chunk_len, scale,
        lower_bound, t_gc, t_gT, t_b, t_qd, t_kd, t_ki, t_kr, head_slot, tap_lo, tap_hi, n_sel, c0,
        H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, GATE: tl.constexpr,
        L2NORM: tl.constexpr, BETA_SIGMOID: tl.constexpr, STORE_QK: tl.constexpr, STORE_RS: tl.constexpr,
        QK_LOWP: tl.constexpr, GC_F64: tl.constexpr, PRECISE: tl.constexpr, STORE_QD: tl.constexpr,
        STORE_TAPS: tl.constexpr, TAP_GC: tl.constexpr, TAP_GT: tl.constexpr, TAP_B: tl.constexpr,
        TAP_QD: tl.constexpr, TAP_KD: tl.constexpr, TAP_KI: tl.constexpr, TAP_KR: tl.constexpr,
        UNROLL: tl.constexpr = 0, AHEAD: tl.constexpr = 0, ABL: tl.constexpr = 0):
    if (ABL & 256) == 0:
        i_c, i_h = tl.program_id(0) + c0, tl.program_id(1)
    else:  # heads fastest: the programs of one chunk run together
        i_c, i_h = tl.program_id(1) + c0, tl.program_id(0)
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n_valid = tl.load(chunk_len + i_c)
    o_t = tl.arange(0, BC)
    m_t = o_t < n_valid
    o_tok = bos + o_t
    o_ch = (i_c * H + i_h).to(tl.int64)
    l_h = tl.load(A_log + i_h)
    a_h = exp_(l_h.to(tl.float32), PRECISE)
    b_beta = tl.load(beta + o_tok * H + i_h, mask=m_t, other=0).to(tl.float32)
    b_b = tl.where(m_t, sigmoid(b_beta, PRECISE), 0.0)
    b_rq = tl.full([BC], 1.0, dtype=tl.float32)
    b_rk = tl.full([BC], 1.0, dtype=tl.float32)
    if (ABL & 4) == 0:
        b_sq = tl.zeros([BC], dtype=tl.float32)
        b_sk = tl.zeros([BC], dtype=tl.float32)
        for i_k in tl.range(0, tl.cdiv(K, BK), loop_unroll_factor=UNROLL if UNROLL else None):
            o_k = i_k * BK + tl.arange(0, BK)
            o_tk = (o_tok[:, None] * H + i_h) * K + o_k[None, :]
            m_tk = m_t[:, None] & (o_k < K)[None, :]
            b_q = tl.load(q + o_tk, mask=m_tk, other=0).to(tl.float32)
            b_k = tl.load(k + o_tk, mask=m_tk, other=0).to(tl.float32)
            b_sq += tl.sum(b_q * b_q, 1)
            b_sk += tl.sum(b_k * b_k, 1)
        b_rq = rsqrt_(b_sq + 1e-6, PRECISE)
        b_rk = rsqrt_(b_sk + 1e-6, PRECISE)
    o_tk0 = (o_tok[:, None] * H + i_h) * K + tl.arange(0, BK)[None, :]
    m_tk0 = m_t[:, None] & (tl.arange(0, BK) < K)[None, :]
    n_q = tl.load(q + o_tk0, mask=m_tk0, other=0)
    n_k = tl.load(k + o_tk0, mask=m_tk0, other=0)
    n_g = tl.load(g + o_tk0, mask=m_tk0, other=0)
    for i_k in tl.range(0, tl.cdiv(K, BK), loop_unroll_factor=UNROLL if UNROLL else None):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        o_tk = (o_tok[:, None] * H + i_h) * K + o_k[None, :]
        r_q, r_k, r_g = n_q, n_k, n_g
        m_next = m_t[:, None] & (o_k + BK < K)[None, :]
        n_q = tl.load(q + o_tk + BK, mask=m_next, other=0)
        n_k = tl.load(k + o_tk + BK, mask=m_next, other=0)
        n_g = tl.load(g + o_tk + BK, mask=m_next, other=0)
        b_q = round_qk(r_q.to(tl.float32) * b_rq[:, None], QK_LOWP)
        b_k = round_qk(r_k.to(tl.float32) * b_rk[:, None], QK_LOWP)
        b_g = r_g.to(tl.float32)
        b_dt = tl.load(dt_bias + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
        if (ABL & 64) == 0:
            b_gam = tl.where(m_tk, gate_act(b_g, b_dt, a_h, lower_bound, GATE, PRECISE), 0.0)
        else:
            b_gam = tl.where(m_tk, b_g * 0.01 - 0.1, 0.0)
        if (ABL & 2) == 0:
            b_gc = tl.cumsum(b_gam, axis=0).to(tl.float32)
        else:
            b_gc = b_gam
        b_gT = tl.sum(tl.where((o_t == n_valid - 1)[:, None], b_gc, 0.0), 0)
        b_kr = tl.where(m_tk, b_k * exp_(b_gT[None, :] - b_gc, PRECISE), 0.0)
        if (ABL & 32) == 0:
            tl.store(qn + o_tk, b_q, mask=m_tk)
            tl.store(kn + o_tk, b_k, mask=m_tk)
        if (ABL & 16) == 0:
            tl.store(gc + o_tk, b_gc, mask=m_tk)
        if (ABL & 1) == 0:
            if (ABL & 128) == 0:
                store_rn(krT + (o_ch * K + o_k[None, :]) * BC + o_t[:, None], b_kr, m_k[None, :])
            else:  # not transposed (wrong layout, the cost of the transpose alone)
                store_rn(krT + (o_ch * BC + o_t[:, None]) * K + o_k[None, :], b_kr, m_k[None, :])
        tl.store(gT + o_ch * K + o_k, b_gT, mask=m_k)
        b_qd = b_q * scale * exp_(b_gc, PRECISE)
        if (ABL & 8) == 0:
            store_rn(qd + o_tk, b_qd, m_tk)
    tl.store(b + o_tok * H + i_h, b_b, mask=m_t)


captured = {}
orig = P.kda_fwd_token_kernel


class Grab:
    def __getitem__(self, grid):
        def launch(**kw):
            captured["grid"], captured["kw"] = grid, dict(kw)
            out = orig[grid](**kw)
            captured["kw"].pop("HEADS_FIRST", None)  # not a parameter of the copy (ABL 256 instead)
            return out
        return launch


def check_cpu():
    from kdadbg_kernels.chunk import chunk_kda
    from peer_inputs import SETTINGS
    P.kda_fwd_token_kernel = Grab()
    x, cu, do = setting_inputs("lower_bound", 128, 2, 128, "cpu")
    kw = {n: t.detach() for n, t in x.items()}
    chunk_kda(**kw, **SETTINGS["lower_bound"], chunk_size=64, cu_seqlens=cu)
    grid, args = captured["grid"], captured["kw"]
    outs = ("qn", "kn", "gc", "krT", "qd", "b", "gT")
    orig[grid](**args, HEADS_FIRST=0)
    ref = {n: args[n].clone() for n in outs}
    for n in outs:
        args[n].fill_(float("nan"))
    tok[grid](**args, ABL=0)
    for n in outs:
        print(n, torch.equal(ref[n], args[n]))
    for n in outs:
        args[n].fill_(float("nan"))
    tok[(grid[1], grid[0])](**args, ABL=256)
    for n in outs:
        print("swapped", n, torch.equal(ref[n], args[n]))


def main():
    from kdadbg_kernels.chunk import chunk_kda
    from peer_inputs import SETTINGS
    P.kda_fwd_token_kernel = Grab()
    H, T = int(os.environ.get("H", 32)), int(os.environ.get("T", 16384))
    abls = [int(a) for a in os.environ.get("ABLS", "0,256,0,256,57,313,8,264").split(",")]
    for setting in ("lower_bound", "softplus"):
        x, cu, do = setting_inputs(setting, T, H, 128, "cuda")
        kw = {n: t.detach() for n, t in x.items()}
        with torch.no_grad():
            chunk_kda(**kw, **SETTINGS[setting], chunk_size=64, cu_seqlens=cu)
        grid, args = captured["grid"], captured["kw"]
        t_orig = triton.testing.do_bench(lambda: orig[grid](**args, HEADS_FIRST=0), warmup=50, rep=300)
        print(f"{setting} H{H} T{T} today's kernel: {t_orig:.4f} ms  (BK {args['BK']}, warps {args['num_warps']})")
        for a in abls:
            gr = (grid[1], grid[0]) if a & 256 else grid
            t = triton.testing.do_bench(lambda: tok[gr](**args, ABL=a), warmup=50, rep=300)
            print(f"{setting} ABL={a:4d}: {t:.4f} ms  ({t - t_orig:+.4f})")
        nb = sum(args[n].numel() * args[n].element_size() for n in ("q", "k", "g", "qn", "kn", "gc", "krT", "qd"))
        print(f"{setting} bytes of q,k,g,qn,kn,gc,krT,qd: {nb / 1e9:.3f} GB; at the baseline {nb / t_orig / 1e6:.0f} GB/s")
        src = torch.empty(nb // 8, dtype=torch.float32, device="cuda")
        dst = torch.empty_like(src)
        t_copy = triton.testing.do_bench(lambda: dst.copy_(src), warmup=20, rep=200)
        print(f"copy of {nb / 2e9:.3f} GB read + written (torch copy_): {t_copy:.4f} ms, {nb / t_copy / 1e6:.0f} GB/s")


if __name__ == "__main__":
    check_cpu() if os.environ.get("TRITON_INTERPRET") == "1" else main()
