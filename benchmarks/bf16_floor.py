"""bf16 mode's noise floor of every output and gradient on one preset at model size: the float32 chunked reference
with bf16 matrix-product operands (kdadbg.noise.floor_reference), and with its result stored in bf16 as fla and
our bf16 kernels return it, each against the float64 reference (fla's ratio). What a correct bf16 computation
lands near, beside fla's bars (o, ht 5e-3; dq, dk, dv 8e-3; dg, dbeta 2e-2).

    python benchmarks/bf16_floor.py [PRESET]     # default kimi at T 8192, H 16, K = V = 128, chunk 64, seed 1
                                                 # (round 41 call 3's dump on the GPU); docs/cpu/bf16_floor.log
"""

from __future__ import annotations

import dataclasses
import sys
import time

import torch

from kdadbg import noise
from kdadbg.cases import get_case, make_inputs
from kdadbg.compare import compare
from kdadbg.reference import run_reference


def main(name: str = "kimi") -> None:
    case = dataclasses.replace(get_case(name), T=8192, H=16, K=128, V=128, chunk_size=64)
    inputs, cfg = make_inputs(case, seed=1)
    t = time.time()
    ref = run_reference(inputs, cfg, taps=())
    floor, _ = noise.floor_reference(inputs, cfg, "bf16", (), "cpu")
    print(f"{name} T{case.T} H{case.H} K{case.K} V{case.V} chunk {cfg.chunk_size} seed 1, inputs {inputs.q.dtype}")
    for n, x in floor.items():
        if n in ref.outputs:
            r = ref.outputs[n]
            print(f"{n}: floor {compare(n, x.to(torch.float64), r).ratio:.4g}, stored in bf16 "
                  f"{compare(n, x.to(torch.bfloat16).to(torch.float64), r).ratio:.4g}", flush=True)
    print(f"({time.time() - t:.0f} s)")


if __name__ == "__main__":
    main(*sys.argv[1:])
