"""How coherently an implementation's dg error sums into dA_log and ddt_bias (kdadbg.compare.carried.coherence):
the evidence for COHERENT. Rounding errors partly cancel in the sums; a bias in dg adds up.

    python benchmarks/coherence.py            # prints one line per case; docs/cpu/coherence.log keeps a run

Cases: the chunked reference in float32 (and with bf16 matrix-product operands) on chunk64_strong at T 512, H 4;
our kernels in bf16 mode (under the Triton interpreter without a GPU) on the kimi, kimi_c64, fla_layer and
kimi_varlen presets, seeds 0 and 1; the float64 reference with head 1's dg moved by 5e-4 of its RMS (a bias).
At longer sequences, where a rounding bias would add up (the bound applies in bf16 mode too):
the float32 reference with bf16 products at T 4096 and 8192, K = V = 64, and our bf16 kernels at T 1024."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from kdadbg.cases import get_case, make_inputs  # noqa: E402
from kdadbg.compare.carried import coherence  # noqa: E402
from kdadbg.impls import resolve_impl  # noqa: E402
from kdadbg.impls.reference import Reference  # noqa: E402
from kdadbg.reference import run_reference  # noqa: E402


def line(label, dg, inputs, config, ref_dg):
    c = coherence(dg, ref_dg, inputs, config)
    print(f"{label}: dA_log per head {[round(float(x), 2) for x in c['dA_log']]}, ddt_bias max "
          f"{float(torch.nan_to_num(c['ddt_bias']).max()):.2f}", flush=True)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs, config = make_inputs(dataclasses.replace(get_case("chunk64_strong"), T=512, H=4), seed=0)
    ref_dg = run_reference(inputs, config, taps=()).outputs["dg"]
    for label, dot in (("float32 reference", None), ("float32 reference, bf16 products", torch.bfloat16)):
        r = Reference(dtype=torch.float32, dot_dtype=dot)
        line(f"{label}, chunk64_strong T512 H4", r.run(inputs, config, device="cpu").outputs["dg"], inputs, config,
             ref_dg)
    biased = ref_dg.clone()
    biased[:, :, 1] += 5e-4 * biased[:, :, 1].pow(2).mean().sqrt()
    line("float64 reference, head 1's dg biased 5e-4 of its RMS, chunk64_strong T512 H4", biased, inputs, config,
         ref_dg)
    for name in ("kimi", "kimi_c64", "fla_layer", "kimi_varlen"):
        for seed in (0, 1):
            inputs, config = make_inputs(get_case(name), seed=seed)
            got = resolve_impl("ours", "bf16").run(inputs, config, device=device).outputs["dg"]
            line(f"ours bf16, {name} seed {seed}", got, inputs, config, run_reference(inputs, config, taps=()).outputs["dg"])
    for name, T, H in (("chunk64_strong", 4096, 4), ("fla_layer", 8192, 2), ("kimi", 4096, 4)):
        inputs, config = make_inputs(dataclasses.replace(get_case(name), T=T, H=H, K=64, V=64), seed=0)
        r = Reference(dtype=torch.float32, dot_dtype=torch.bfloat16)
        line(f"float32 reference, bf16 products, {name} T{T} H{H} K64", r.run(inputs, config, device="cpu").outputs["dg"],
             inputs, config, run_reference(inputs, config, taps=()).outputs["dg"])
    for name in ("kimi", "fla_layer"):
        inputs, config = make_inputs(dataclasses.replace(get_case(name), T=1024), seed=0)
        got = resolve_impl("ours", "bf16").run(inputs, config, device=device).outputs["dg"]
        line(f"ours bf16, {name} T1024", got, inputs, config, run_reference(inputs, config, taps=()).outputs["dg"])


if __name__ == "__main__":
    main()
