"""Launch parameters of the kernels, with benchmark-only overrides.

Each kernel asks ``knob(NAME, default)`` for a block size, warp count or stage count; the default is
what was chosen from ``benchmarks/kernel_resources.py`` (no register spills on sm_90) and the H200
profiles in ``docs/benchmarks.md``. Setting ``KDADBG_<NAME>`` in the environment overrides it, so that
``benchmarks/stage_bench.py`` can time variants in one GPU call without editing code. ``*_ABLATE``
knobs switch parts of a kernel off (wrong results, timing only); they are 0 in normal use, and a
non-zero one raises unless ``KDADBG_ALLOW_ABLATE=1``.
"""

from __future__ import annotations

import os


def knob(name: str, default: int) -> int:
    raw = os.environ.get(f"KDADBG_{name}")
    if raw is None:
        return default
    try:
        val = int(raw)
    except ValueError:
        raise ValueError(f"KDADBG_{name}: expected an integer, found {raw!r}") from None
    if name.endswith("_ABLATE") and val and os.environ.get("KDADBG_ALLOW_ABLATE") != "1":
        raise ValueError(f"KDADBG_{name}={val} switches kernel parts off (timing only); "
                         "set KDADBG_ALLOW_ABLATE=1 to mean it")
    return val


def block_size(n: int, hi: int | None = None) -> int:
    """Block of a tile dimension of size ``n``: the next power of two, at least 16 (a tensor-core
    ``tl.dot`` needs a reduction dimension of 16 or more on sm_90: K = 8 does not compile there), at
    most ``hi``. Loads and stores mask the padding."""
    import triton

    p = max(16, triton.next_power_of_2(n))
    return p if hi is None else min(p, hi)


def state_tile_cap(K: int) -> int:
    """Widest V block (16 to 64) whose [K, BV] fp32 state tile stays within 8192 elements."""
    return max(16, min(64, 8192 // block_size(K)))


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device; 132 (an H200's) elsewhere, e.g. under the interpreter."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def state_block_v(name: str, n_chains: int, K: int, V: int, device, per_sm: int) -> int:
    """V block of a state pass over ``n_chains`` (sequences × heads) sequential chains: the smallest of
    16, 32, 64 that launches at most ``per_sm`` programs per SM (more programs reload the same ``w``/``kr``
    tiles; fewer leave SMs idle), capped so that the [K, BV] fp32 state stays at most 8192 elements.
    Chosen from H200 stage timings: forward per_sm 1 (docs/gpu/round11), backward 6 (round15/call3:
    after its loads were pipelined, more and narrower programs won on the varlen batch).
    ``KDADBG_<name>`` overrides it."""
    cap = state_tile_cap(K)
    budget = per_sm * sm_count(device)
    bv = 16
    while bv < cap and n_chains * -(-V // bv) > budget:
        bv *= 2
    return knob(name, bv)


SMEM_SM90 = 232448  # bytes of shared memory one program may opt into on an H100/H200


def smem_limit(device) -> int:
    """Shared memory one program may use on ``device``; an H200's off the GPU (the interpreter,
    ``benchmarks/kernel_resources.py``'s sm_90 compiles)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    return SMEM_SM90


def pipeline_stages(name: str, want: int, per_stage: int, fixed: int, device) -> int:
    """``num_stages`` of a state pass: ``want``, or fewer while the pipeliner's buffers (``per_stage``
    bytes for each stage's prefetched tiles, ``fixed`` for the rest) would not fit in shared memory
    (Triton then refuses the launch: at H = 32 three stages of the forward state pass needed 245760 of
    232448 bytes, docs/gpu/round15/call2). The callers' counts match the compiled kernels' shared
    memory to the byte in bf16 mode (``benchmarks/kernel_resources.py``, sm_90);
    ``tests/test_layouts.py`` checks that every launch fits. ``KDADBG_<name>`` overrides it."""
    limit = smem_limit(device)
    stages = want
    while stages > 1 and fixed + stages * per_stage > limit:
        stages -= 1
    return knob(name, stages)
