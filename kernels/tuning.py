"""Launch knobs of the kernels: one table of every knob, its default and meaning, and the helpers that
size blocks, V blocks and pipeline stages.

Each launch asks ``knob(NAME, default)``; the default is written beside the launch and described in
``KNOBS``. Setting ``KDADBG_<NAME>`` in the environment overrides it, so that ``benchmarks/stage_bench.py``
and ``benchmarks/accuracy_ab.py`` can time or check variants without editing code; normal use sets
none. ``Knob.results`` separates the knobs that may change results (outputs, gradients or taps) from
the launch-only ones, which keep every bit on the GPU (under the Triton interpreter ``REC_BV``, ``RECB_BV``
and ``PREP_WU_BK`` do move bits: NumPy's BLAS rounds a product differently with its width). ``overrides()`` lists the overrides in effect: the
``run``/``diff`` JSON records them.

The defaults come from register use on sm_90 (``benchmarks/kernel_resources.py``) and H200 stage
timings (``docs/benchmarks.md``, ``docs/kernels.md``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass


class KnobError(ValueError):
    """A ``KDADBG_*`` knob set to a value the kernels cannot take: the message names the variable, what was
    expected and what was found (the command line prints it as one line, exit 2)."""


@dataclass(frozen=True)
class Knob:
    default: str     # the default, or the rule that picks it
    meaning: str
    results: bool    # True: an override may change results; False: launch only, the same bits


KNOBS: dict[str, Knob] = {
    # knobs that may change results
    "FWD_LOWP": Knob("11 in bf16 mode (u in fp32), 0 in fp32 mode",
                     "bit mask, bf16 mode: 1 w, 2 krT, 4 u stored in bf16; 8 the state pass's products as "
                     "bf16 MMAs (else tf32)", True),
    "FWD_FUSE_OUT": Knob("1 in bf16 mode, 0 in fp32 mode",
                         "1: the forward state pass forms o; the output pass then writes taps only", True),
    "FWD_FUSE_WU": Knob("0", "bf16 mode with FWD_FUSE_OUT: 1 runs no w/u kernel: the token kernel stores kd = "
                        "kn exp(gc) in bf16 and the forward state pass forms U = INV Diag(b) (v - kd S) itself "
                        "(chunk.fuse_wu); 2 only in a forward with no backward to follow. On CUDA checked at chunk 64 "
                        "(docs/gpu/round59); its CUDA test at every chunk size (tests/test_kernels_gpu.py) not yet "
                        "run", True),
    "INFER_GC_FROM_G": Knob("0", "bf16 mode, a forward with no backward and no taps, with FWD_FUSE_WU: 1 stores no gc; "
                            "the intra kernel forms gc itself from the raw gate, 16 rows at a time "
                            "(prepare.infer_gc_from_g)", True),
    "PREP_QK_LOWP": Knob("2", "bf16 mode with in-kernel l2norm: the normalised q, k stored rounded to nearest once, "
                         "2 in fp16, 1 in bf16 (as fla), 0 in fp32; every later use (the token kernel's qd, kr, "
                         "the intra, w/u and output passes, the backward) reads the stored values "
                         "(prepare.qk_lowp_mode). fp32 mode: no effect", True),
    "GC_F64": Knob("1 in fp32 mode, 0 in bf16 mode",
                   "1: the forward token kernel forms the gate and its within-chunk cumsum gc in float64, "
                   "rounded to fp32 once: gc's error is then one rounding (e.g. 3.8e-6 at |gc| = 90) rather than "
                   "a float32 sum's, which exp(-gc) carries into ki, dqd, dkd and the gate gradient", True),
    "EXP_FTZ": Knob("1 (bf16 mode on the GPU)", "bf16 mode on the GPU: 1 takes exp as ex2.approx.ftz of "
                    "x·log2(e), results below 2^-126 flushed to 0 (every other result the same bits as tl.exp, "
                    "which adds a subnormal fix-up); 0: tl.exp. Read once, when the kernels are imported "
                    "(tlmath.exp_)", True),
    "STATE_F64": Knob("1 (fp32 mode only)", "1: the forward state pass carries S, U in float64 (float64 products), "
                      "the backward dS (fp32 products), stored in fp32 (common.state_f64); 0: in fp32", True),
    "PREP_BK": Knob("K rounded up to a power of two, 16 to 64 (to 32 with the gate or l2norm in the kernel; 16 at "
                    "chunk 64 with the gate in the kernel and fp32 qn, kn stored)",
                    "K block of the forward token kernel (the l2norm row sums add per block)", True),
    "PREP_SOLVE_BK": Knob("16", "K block of the forward intra/solve kernel's products", True),
    "DQKG_BK": Knob("K rounded up to a power of two, 16 to 32",
                    "K block of the backward K pass (db adds one partial per block)", True),
    "DQKGV_BV": Knob("V rounded up to a power of two, 16 to 64 in bf16 mode at chunk 64, else 16 to 32",
                     "V tile of the backward V pass's loop (its products add per tile)", True),
    "DQKG_SPLIT": Knob("2 at chunk 64, else 3",
                       "bf16 modes: tf32 MMAs per gate-sensitive K pass product (1: one, as fla; 2: a·hi(b) + "
                       "a·lo(b); 3: tf32x3; prepare_bwd.mm_x3 says why not 1)", True),
    "DQKG_BLOCKED": Knob("1 in bf16 mode, 0 in fp32 mode",
                         "1: the K pass's intra-chunk products as [C, 16]·[16, BK] blocks; 0: masked "
                         "[C, C]·[C, BK] products", True),
    "FINISH_BK": Knob("K rounded up to a power of two, 16 to 128",
                      "K block of the backward finish kernel's l2norm backward (a block of all of K reads the "
                      "rows once; the row sums add per block)", True),
    "PREP_WARPS": Knob("8 at chunk 64 with the gate in the kernel and fp32 qn, kn stored, else 4",
                       "warps of the forward token kernel (on the H200 8 against 4 moved bits: gc's cumsum adds "
                       "in the order of its register layout, which follows the warps)", True),
    "BWD_FWD_OPERANDS": Knob("1 in bf16 mode, 0 in fp32 mode",
                             "bit mask, bf16 mode: the backward's reverse state pass reads the forward's "
                             "1 qd (the product the backward formed again: the same bits), 2 w (the "
                             "forward's tf32 product, not the backward's bf16 one); 0 neither "
                             "(chunk.bwd_fwd_operands)", True),
    # launch-only knobs: the same bits
    "QK_ROWSCALE": Knob("1", "fp32 mode with l2norm: 1 keeps the l2norm as row scales rq, rk [BT, H]; every "
                             "kernel that reads qn, kn forms q * rq from the raw q itself (prepare.qk_rowscale); "
                             "0: the token kernel stores qn, kn in fp32", False),
    "INFER_ROWSCALE": Knob("1", "bf16 mode with l2norm (at chunk 64 with qn, kn rounded: PREP_QK_LOWP 1 or 2), a "
                                "forward with no backward to follow and no taps: 1 keeps the l2norm as row scales "
                                "rq, rk, as QK_ROWSCALE does in fp32 mode, each reader rounding q * rq as the token "
                                "kernel does (prepare.rowscale_for_inference); 0: qn, kn stored as in training",
                           False),
    "MQK_BF16": Knob("1", "bf16 mode: 1 stores Mqk [NC, H, C, C] in bf16 (rounded to nearest even), the operand "
                          "every reader's MMA rounds it to anyway (the state pass's o, the output pass, the "
                          "backward's dU0): the same bits, half the bytes; its tap is then stored from the "
                          "intra kernel's fp32 registers instead of read from Mqk (prepare.mqk_bf16); 0: fp32",
                     False),
    "S_BF16": Knob("1", "bf16 mode: 1 stores the forward's per-chunk states S [NC, H, K, V] in bf16 (rounded to "
                   "nearest; the S tap from the state pass's fp32 registers); the backward's rowsum(dS+ * S) then "
                   "reads the rounded S (common.s_bf16)", True),
    "UDU_BF16": Knob("1", "bf16 mode: 1 stores U and the completed dU [BT, H, V] in bf16 (rounded to nearest "
                          "even), the operand the V pass's MMAs round them to anyway: the same bits, half the "
                          "bytes; their taps are then stored by the state passes from their fp32 registers "
                          "(common.udu_bf16); 0: fp32", False),
    "PREP_UNROLL": Knob("the number of K blocks at PREP_WARPS' 8-warp launch (chunk 64, gate in the kernel, qn, kn "
                        "stored), else 0",
                        "forward token kernel: its two K-block loops unrolled by this factor (0: not unrolled), so "
                        "that later blocks' loads may issue before earlier blocks' work", False),
    "PREP_AHEAD": Knob("1 at PREP_WARPS' 8-warp launch, else 0",
                       "forward token kernel: 1 loads the next K block's q, k, g one step ahead of the block's own "
                       "work (the loads feed no tl.dot, so the pipeliner leaves them in place)", False),
    "PREP_MAXNREG": Knob("0 (the compiler's choice)", "forward token kernel: registers per thread at most (Triton's "
                         "maxnreg; more programs per SM where the compiler would take more)", False),
    "PREP_STAGES": Knob("3", "pipeline stages of the forward token kernel", False),
    "PREP_SOLVE_STAGES": Knob("2", "pipeline stages of the forward intra/solve kernel", False),
    "BPREP_WARPS": Knob("4", "warps of the backward precompute kernel (chunk_bwd_prep)", False),
    "BPREP_STAGES": Knob("3", "pipeline stages of the backward precompute kernel", False),
    "BPREP_BK": Knob("K rounded up to a power of two, 16 to 64",
                     "K block of the backward precompute's kr and w (products over the chunk's rows only)", False),
    "BPREP_BV": Knob("V rounded up to a power of two, 16 to 64",
                     "V block of the backward precompute's Mqk^T dO (products over the chunk's rows only)", False),
    "PREP_SOLVE_WARPS": Knob("1", "warps of the forward intra/solve kernel", False),
    "PREP_WU_BK": Knob("max(K, V) rounded up to a power of two, 16 to 32",
                       "column block of the forward w/u kernel", False),
    "PREP_WU_WARPS": Knob("4", "warps of the forward w/u kernel", False),
    "PREP_WU_STAGES": Knob("3", "pipeline stages of the forward w/u kernel", False),
    "REC_BV": Knob("tuning.state_block_v, at most 1 program per SM",
                   "V block of the forward state pass", False),
    "REC_STAGES": Knob("3, or fewer where shared memory is short (tuning.pipeline_stages)",
                       "pipeline stages of the forward state pass", False),
    "REC_U_AHEAD": Knob("1 where it buys a pipeline stage at 32 columns or fewer, and in bf16 mode's fused state "
                        "pass at 16 columns (recurrence.state_pass_plan)",
                        "1: the forward state pass loads u one step ahead into registers", False),
    "REC_INV_AHEAD": Knob("1 where it buys a pipeline stage at 32 columns or fewer (FWD_FUSE_WU)",
                          "1: the forward state pass without the w/u kernel loads INV one step ahead into "
                          "registers, out of its pipeline's stages", False),
    "REC_WARPS": Knob("4", "warps of the forward state pass", False),
    "OUT_NVB": Knob("every V block", "V blocks (up to 64 columns each) one output-pass program covers",
                    False),
    "OUT_WARPS": Knob("8 with taps at C * BK > 4096, else 4", "warps of the output pass", False),
    "OUT_STAGES": Knob("1", "pipeline stages of the output pass", False),
    "STATE_LONGEST_FIRST": Knob("1", "1: the state passes launch the sequences with most chunks first; "
                                     "0: in the given order", False),
    "RECB_BV": Knob("tuning.state_block_v, at most 6 programs per SM",
                    "V block of the backward state pass", False),
    "RECB_STAGES": Knob("2 where the launch has more programs than SMs and two of them fit in one SM's "
                        "shared memory at 2 stages but not at 3, else 3; fewer where shared memory is short "
                        "(tuning.stages_for_residency)", "pipeline stages of the backward state pass", False),
    "RECB_WARPS": Knob("4", "warps of the backward state pass", False),
    "RECB_DH0_SLOT": Knob("1 at V blocks of 32 columns or more, else 0",
                          "1: the backward state pass stores dh0 from one more loop step, into the slot "
                          "before dSn", False),
    "DQKGV_UNCOND": Knob("1 in fp32 mode, 0 in bf16 mode",
                         "1: the V pass forms its V-only products in every K block (only block 0's are "
                         "kept); 0: in block 0 alone, which the H200 build of Triton 3.6 got wrong in fp32 "
                         "mode", False),
    "DQKGV_WARPS": Knob("4 at chunk 16, else 8", "warps of the backward V pass", False),
    "DQKGV_STAGES": Knob("3", "pipeline stages of the backward V pass", False),
    "FINISH_WARPS": Knob("8", "warps of the backward finish kernel", False),
    "FINISH_STAGES": Knob("3", "pipeline stages of the backward finish kernel", False),
    "DQKG_PREFETCH": Knob("1 in the bf16 modes", "backward K pass: 1 asks for the lines of the rows it reads "
                          "after its block loops (the V pass's dO S^T, dvcorr S^T, dkr; the raw gate) into L2 at its "
                          "start (tlmath.prefetch_l2)", False),
    "DQKG_WARPS": Knob("4", "warps of the backward K pass", False),
    "DQKG_MAXNREG": Knob("0 (the compiler's choice)", "backward K pass: registers per thread at most (Triton's "
                         "maxnreg; more programs per SM, at the price of spills)", False),
    "DQKG_STAGES": Knob("3", "pipeline stages of the backward K pass", False),
    "DQKG_LOOP_STAGES": Knob("with the block products (DQKG_BLOCKED): 3 at chunk 64, 2 at chunk 32; else 1",
                             "pipeline stages of the backward K pass's P and Q block loops (1: each block's "
                             "loads issued in its own step)", False),
    "HEADS_FIRST": Knob("1", "1: the kernels parallel over chunks and heads (the forward's token, intra, w/u and "
                             "output kernels; the backward precompute, V pass and finish kernel) run on a "
                             "1-D grid with the heads (and K or V blocks) of one chunk adjacent, so that the "
                             "programs running together read and write neighbouring rows of the [BT, H, .] "
                             "tensors; 0: a (chunks, heads) grid, one head's chunks adjacent", False),
    "DQKG_HEADS_FIRST": Knob("0", "backward K pass: 1 launches it heads first, as HEADS_FIRST the other kernels",
                             False),
    "TAPS_ALIAS": Knob("1", "1: taps that are the kernels' own tensors are read from them; 0: stored "
                            "again into tap buffers", False),
    "TAPS_FILL_STATE": Knob("1", "1: the backward state pass's programs NaN-fill the tap buffers of the passes "
                                 "after it, a few blocks a chain step; 0: filled up front", False),
}


def _env_key(name: str):
    """``KDADBG_<name>`` as the key of ``os.environ``'s own mapping (bytes on POSIX)."""
    return os.environ.encodekey(f"KDADBG_{name}")


_ENV_KEYS = {n: _env_key(n) for n in KNOBS}


_READS: dict[str, set[int]] | None = None   # record_reads: the values the calls inside read, per knob


@contextlib.contextmanager
def record_reads():
    """``{NAME: {values}}`` of every knob read by the calls inside (``knob``'s result, override or default):
    what an A/B variant must change to differ from the defaults (``benchmarks/peer_inputs.variant_effect``)."""
    global _READS
    reads = {}
    outer, _READS = _READS, reads
    try:
        yield reads
    finally:
        _READS = outer


def knob(name: str, default: int) -> int:
    """Knob ``name`` of ``KNOBS``: ``default``, or the integer in ``KDADBG_<name>``.

    A call asks for about 65 knobs (``benchmarks/host_time.py --profile``), so the environment is read
    from ``os.environ``'s own mapping with the key encoded once: one dict lookup, not
    ``os.environ.get``'s encode and decode. Every change made through ``os.environ`` (``monkeypatch.setenv``,
    ``mock.patch.dict``, ``del``) lands in that mapping, so the value is always the current one; where
    ``os.environ`` has no such mapping, ``os.environ.get``."""
    key = _ENV_KEYS.get(name)
    if key is None:
        raise KeyError(f"knob {name!r} is not in kernels/tuning.py's KNOBS")
    data = getattr(os.environ, "_data", None)
    if data is None:
        raw = os.environ.get(f"KDADBG_{name}")
    else:
        raw = data.get(key)
        if raw is None:
            if _READS is not None:
                _READS.setdefault(name, set()).add(default)
            return default
        raw = os.environ.decodevalue(raw)
    if raw is None:
        value = default
    else:
        try:
            value = int(raw)
        except ValueError:
            raise KnobError(f"KDADBG_{name}: expected an integer, found {raw!r}") from None
    if _READS is not None:
        _READS.setdefault(name, set()).add(value)
    return value


def overrides() -> dict[str, str]:
    """The knobs set in the environment, ``{NAME: value}`` (raw strings), in ``KNOBS`` order."""
    return {n: os.environ[f"KDADBG_{n}"] for n in KNOBS if f"KDADBG_{n}" in os.environ}


def reg_cap(n: int) -> dict:
    """The launch options of a register-cap knob's value ``n`` (``PREP_MAXNREG``, ``DQKG_MAXNREG``):
    ``{"maxnreg": n}``, or none at 0, the default (the compiler's choice)."""
    return {"maxnreg": n} if n else {}


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for the host's launch arithmetic: plain Python (``triton.cdiv`` is a constexpr
    function, several times slower to call from the host, and a launch makes several such calls)."""
    return -(-a // b)


def block_size(n: int, hi: int | None = None) -> int:
    """Block of a tile dimension of size ``n``: the next power of two, at least 16 (a tensor-core
    ``tl.dot`` needs a reduction dimension of 16 or more on sm_90: K = 8 does not compile there), at
    most ``hi``. Loads and stores mask the padding."""
    p = max(16, 1 << (n - 1).bit_length())
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
    The callers' ``per_sm`` come from H200 stage timings: 1 for the forward; 6 for the backward, whose
    pipelined loads make more and narrower programs faster on a varlen batch. ``KDADBG_<name>``
    overrides it."""
    cap = state_tile_cap(K)
    budget = per_sm * sm_count(device)
    bv = 16
    while bv < cap and n_chains * cdiv(V, bv) > budget:
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


SMEM_PER_SM_SM90 = 233472  # bytes of shared memory of one H100/H200 SM, for all its resident programs
SMEM_RESERVED = 1024       # bytes the driver reserves per resident program (sm_80 and later)


def smem_per_sm(device) -> int:
    """Shared memory of one SM of ``device``, shared by its resident programs; an H200's off the GPU."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return getattr(props, "shared_memory_per_multiprocessor", SMEM_PER_SM_SM90)
    return SMEM_PER_SM_SM90


def stages_for_residency(n_programs: int, per_stage: int, fixed: int, device, few: int = 2, many: int = 3) -> int:
    """Pipeline stages of a state pass's launch of ``n_programs``: ``few`` where the launch has more
    programs than SMs and two programs fit in one SM's shared memory together at ``few`` stages but not at
    ``many``, so that each SM then runs two chains at once; else ``many``, the deeper prefetch. On the
    H200 the backward state pass at chunk 64 and 16 columns in bf16 mode (two stages 110592 bytes, three
    161792) took 0.772 -> 0.638 ms at lower-bound H32 T16384 (256 programs) with two stages against three,
    while at H16 (128 programs: one per SM) forward + backward took 4.505 ms with three stages and 4.636
    with two (docs/gpu/round31/call3, call4). Where two programs fit at ``many`` stages too (chunks 16 and
    32) or at neither (fp32 mode, 32 columns), nothing changes."""
    def two_fit(stages: int) -> bool:
        return 2 * (fixed + stages * per_stage + SMEM_RESERVED) <= smem_per_sm(device)

    if n_programs > sm_count(device) and two_fit(few) and not two_fit(many):
        return few
    return many


def pipeline_stages(name: str, want: int, per_stage: int, fixed: int, device) -> int:
    """``num_stages`` of a state pass: ``want``, or fewer while the pipeliner's buffers (``per_stage``
    bytes for each stage's prefetched tiles, ``fixed`` for the rest) would not fit in shared memory
    (Triton then refuses the launch: at H = 32 three stages of the forward state pass would need 245760
    of 232448 bytes). The callers' counts match the compiled kernels' shared memory to the byte in bf16
    mode (``benchmarks/kernel_resources.py``, sm_90); ``tests/test_layouts.py`` checks that every launch
    fits. ``KDADBG_<name>`` overrides it."""
    limit = smem_limit(device)
    stages = want
    while stages > 1 and fixed + stages * per_stage > limit:
        stages -= 1
    return knob(name, stages)
