"""Second, independent look at the FlashKDA fork's gate gradient (GPU, the patched fork build):
the float64 reference's backward stages fed the fork's own buffers, stage by stage.

    python benchmarks/flashkda_second_look.py DUMP OUT.json

1. ``bwd_recurrence``: the reference's reverse walk run on the fork's forward as its backward reads it
   (fp32 copies of kd, qd, ki, kr; bf16 INV, Mqk, all_states; g_cumsum, g_total), compared with the fork's
   backward-workspace taps (dkd, dqd, dki, dkr, dgT, db): is K2_bwd right about its own inputs?
2. ``bwd_prepare`` + gate chain: K1_bwd's formula in float64 on the fork's K2_bwd taps, once with qn, kn
   recomputed unrounded (what K1_bwd does: fp32 rsqrt of the raw q, k) and once with qn, kn rounded to
   bf16 (what the forward's kd/qd/ki/kr copies were built from), each compared with the fork's dg/dgc
   and with the reference's. If the unrounded variant reproduces the fork's dg and the rounded one the
   reference's, the error is made in K1_bwd by that mismatch (the gate-independent pair terms stop
   cancelling in the reverse cumsum), not upstream of it.
3. ``consistent``: the reference computed with qn, kn rounded to bf16 throughout: the dg error a kernel
   that rounds qn, kn once, consistently, would have.
"""

from __future__ import annotations

import json
import math
import sys

import torch

from kdadbg.compare import compare
from kdadbg.dump import load_dump
from kdadbg.impls import flashkda as fk
from kdadbg.impls import flashkda_convert as fc
from kdadbg.reference import (Decay, _state_in, _to_chunks, _to_tokens, activate, bwd_prepare, bwd_recurrence,
                              fwd_prepare, fwd_recurrence, run_reference)
from kdadbg.tapsfile import zero_padding

LN2 = math.log(2.0)


def ratio(a, b) -> float:
    return float(compare("x", a.double(), b.double()).ratio)


def per_chunk(a, b) -> list[float]:
    """fla's ratio per chunk (over heads and rows) of chunk-major ``a`` against ``b``."""
    d = (a - b).double().flatten(1).pow(2).mean(1).sqrt()
    return (d / (b.double().flatten(1).pow(2).mean(1).sqrt() + 1e-8)).tolist()


def main(dump: str, out: str) -> None:
    inputs, config = load_dump(dump)
    impl = fk.FlashKDA()
    config, note = impl.config_for(config)
    if impl.build != "fork+patch":
        raise SystemExit(f"second look: needs the patched fork build, found {impl.build} ({impl.where})")
    dev = "cuda"
    x_in = inputs.to(dev)
    call = fk._Call(x_in, config)
    fork = call.forward_backward()
    bufs = call.raw_forward(with_states=True)
    bufs.update(call.raw_backward())
    ref = run_reference(inputs, config, taps=("gc", "gT", "b", "S", "dkd", "dqd", "dki", "dkr", "dgT", "db", "dgc"),
                        device=dev)
    ct = ref.chunks
    n, lengths = ct.n_chunks, ct.length.to(dev)
    B, T, H, K, V = inputs.shape
    f64 = torch.float64

    def cm(name, tap_name):
        return zero_padding(tap_name, fc._chunk_major(bufs[name], n), lengths)

    gc = cm("g_cumsum", "gc") * LN2
    gT = torch.log(fc._chunk_major(bufs["g_total"], n))
    p = {"kd": cm("kd_fp32", "kd"), "qd": cm("qd_fp32", "qd"), "ki": cm("ki_fp32", "ki"), "kr": cm("kr_fp32", "kr"),
         "INV": cm("INV", "INV"), "Mqk": cm("Mqk", "Mqk"), "gc": gc, "gT": gT, "b": ref.taps["b"]}
    p["F"] = torch.tril(p["kd"] @ p["ki"].transpose(-1, -2), -1)
    p["decay"] = Decay(gc)
    idx, valid = (t.to(dev) for t in ct.token_index())
    v = _to_chunks(x_in.v.to(f64).reshape(B * T, H, V), idx, valid)
    do = _to_chunks(x_in.do.to(f64).reshape(B * T, H, V), idx, valid)
    S = cm("S", "S").transpose(-1, -2)
    W = v - p["kd"] @ S
    U = p["INV"] @ (p["b"][..., None] * W)
    dhT = _state_in(inputs.dht, config.state_layout, (inputs.n_seqs, H, K, V), f64, dev)
    r = bwd_recurrence(p, {"S": S, "U": U, "W": W}, do, dhT, ct, dev)
    leaves, act = activate(inputs, config, f64, dev)
    x = {k_: _to_chunks(t.detach(), idx, valid) for k_, t in act.items()}
    defs = bwd_prepare(x, p, r, config.scale)
    theirs = {name: cm(name, name) for name in ("dkd", "dqd", "dki", "dkr", "dgT", "db", "dgc")}
    mine = {"dkd": defs["dkd"], "dqd": defs["dqd"], "dki": defs["dki"], "dkr": r["dkr"], "dgT": r["dgT"], "db": r["db"]}
    stage1 = {name: {"fork_vs_reference_fed_fork_forward": ratio(theirs[name], mine[name]),
                     "fork_vs_reference": ratio(theirs[name], ref.taps[name]),
                     "worst_chunk": int(torch.tensor(per_chunk(theirs[name], mine[name])).argmax())}
              for name in mine}

    E, Ei, R = torch.exp(gc), torch.exp(-gc), torch.exp(gT[:, :, None] - gc)
    a = torch.exp(inputs.A_log.to(dev, f64))[:, None]
    z = a * (inputs.g.to(dev, f64).reshape(B * T, H, K) + inputs.dt_bias.to(dev, f64).reshape(H, K))
    sig = torch.sigmoid(z)
    rb = lambda t: t.to(torch.bfloat16).to(f64)  # noqa: E731

    def k1_bwd(qn, kn):
        dgc = qn * config.scale * E * theirs["dqd"] + kn * (E * theirs["dkd"] - Ei * theirs["dki"] - R * theirs["dkr"])
        dgc = zero_padding("dgc", dgc, lengths)
        dgam = torch.flip(torch.cumsum(torch.flip(dgc, [2]), 2), [2]) + theirs["dgT"][:, :, None, :]
        dz = _to_tokens(dgam, idx, valid, B * T) * config.lower_bound * sig * (1 - sig)
        return dgc, (a * dz).reshape(B, T, H, K), (a * dz).sum(0), (dz * z).sum((0, 2))

    stage2 = {}
    for label, (qn, kn) in {"unrounded qn,kn (as K1_bwd)": (x["qn"], x["kn"]),
                            "bf16 qn,kn (as the forward's copies)": (rb(x["qn"]), rb(x["kn"]))}.items():
        dgc, dg, ddt, dA = k1_bwd(qn, kn)
        stage2[label] = {
            "dgc_vs_fork_dgc": ratio(dgc, theirs["dgc"]), "dgc_vs_reference": ratio(dgc, ref.taps["dgc"]),
            "dg_vs_fork_dg": ratio(dg, fork["dg"]), "dg_vs_reference": ratio(dg, ref.outputs["dg"]),
            "ddt_bias_vs_reference": ratio(ddt, ref.outputs["ddt_bias"].reshape(H, K)),
            "dA_log_vs_reference": ratio(dA, ref.outputs["dA_log"]),
            "dgc_per_chunk_vs_reference": [round(c, 6) for c in per_chunk(dgc, ref.taps["dgc"])],
        }

    xr = {**x, "qn": rb(x["qn"]), "kn": rb(x["kn"])}
    pr = fwd_prepare(xr, config.scale)
    S0 = _state_in(inputs.h0, config.state_layout, (inputs.n_seqs, H, K, V), f64, dev)
    rr = bwd_recurrence(pr, fwd_recurrence(pr, v, S0, ct, dev), do, dhT, ct, dev)
    br = bwd_prepare(xr, pr, rr, config.scale)
    dz = _to_tokens(br["dgam"], idx, valid, B * T) * config.lower_bound * sig * (1 - sig)
    stage3 = {"dg_vs_reference": ratio((a * dz).reshape(B, T, H, K), ref.outputs["dg"]),
              "ddt_bias_vs_reference": ratio((a * dz).sum(0), ref.outputs["ddt_bias"].reshape(H, K))}

    fork_dgc = per_chunk(theirs["dgc"], ref.taps["dgc"])
    result = {
        "dump": dump, "config_note": note, "build": impl.build, "where": impl.where, "shape": [B, T, H, K, V],
        "fork_vs_reference": {g: ratio(fork[g], ref.outputs[g]) for g in ("dq", "dk", "dv", "dbeta", "dg", "dA_log",
                                                                          "ddt_bias")},
        "fork_dgc_vs_reference": ratio(theirs["dgc"], ref.taps["dgc"]),
        "fork_dgc_first_chunk_over_2e-2": next((c for c, v_ in enumerate(fork_dgc) if v_ > 2e-2), None),
        "stage1_bwd_recurrence_fed_fork_forward": stage1,
        "stage2_k1_bwd_formula_on_fork_taps": stage2,
        "stage3_reference_with_bf16_qn_kn_throughout": stage3,
    }
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps({k_: v_ for k_, v_ in result.items() if not k_.startswith("stage2")}, indent=1))
    for label, d in stage2.items():
        print(label, {k_: v_ for k_, v_ in d.items() if k_ != "dgc_per_chunk_vs_reference"})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
