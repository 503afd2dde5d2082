"""The kernels compiled for sm_90, no GPU needed. Taps must not change how a reduction adds: every
``tl.sum``/``tl.cumsum`` keeps its register layout with taps on, and every product that Triton gave an
accumulator keeps it (``benchmarks/layout_check.py``). No
launch may need more shared memory than an H200 grants (``benchmarks/kernel_resources.py``). No
state-pass step may wait on a load (``benchmarks/loop_check.py``).

Before ``row_sums`` the K pass's reverse scan of dgc moved layout in fp32 mode with taps on, and dg
changed in its last bits on the H200; this check flags that code.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from layout_check import accumulating_dots, moved, reductions, source  # noqa: E402
from loop_check import loop_bodies, waited_loads  # noqa: E402


def run_script(name: str, *args: str, knobs: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A ``benchmarks/`` script in a fresh process, compiled rather than interpreted (``knobs``: ``KDADBG_*``
    settings of that process)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({f"KDADBG_{k}": v for k, v in (knobs or {}).items()})
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], capture_output=True,
                          text=True, env=env, cwd=ROOT)

TTGIR = """#blocked = #ttg.blocked<{sizePerThread = [1, 4], threadsPerWarp = [4, 8], warpsPerCTA = [4, 1], order = [1, 0]}>
#blocked1 = #ttg.blocked<{sizePerThread = [2, 2], threadsPerWarp = [2, 16], warpsPerCTA = [4, 1], order = [1, 0]}>
module {
    %a = "tt.scan"(%x) <{axis = 0 : i32, reverse = true}> ({
    ^bb0(%p: f32, %q: f32):
      %s = arith.addf %p, %q : f32
      tt.scan.return %s : f32
    }) : (tensor<16x32xf32, #blocked1>) -> tensor<16x32xf32, #blocked1>
    %b = "tt.reduce"(%a) <{axis = 1 : i32}> ({
    ^bb0(%p: f32, %q: f32):
      %s = arith.addf %p, %q : f32
      tt.reduce.return %s : f32
    }) : (tensor<16x32xf32, #blocked>) -> tensor<16xf32, #ttg.slice<{dim = 1, parent = #blocked}>>
    %c = "tt.reduce"(%b) <{axis = 0 : i32}> ({
    ^bb0(%p: f32, %q: f32):
      %s = arith.addf %p, %q : f32
      tt.reduce.return %s : f32
    }) : (tensor<16xf32, #ttg.slice<{dim = 1, parent = #blocked}>>) -> f32
}
"""


def test_reductions_parses_ops_shapes_and_spelled_out_layouts():
    r = reductions(TTGIR)
    assert [x[:2] for x in r] == [("scan axis 0", "16x32xf32"), ("reduce axis 1", "16x32xf32"),
                                  ("reduce axis 0", "16xf32")]
    assert "sizePerThread = [2, 2]" in r[0][2] and "sizePerThread = [1, 4]" in r[1][2]
    assert r[2][2].startswith("#ttg.slice<{dim = 1, parent = #ttg.blocked<{sizePerThread = [1, 4]")
    moved = reductions(TTGIR.replace("(tensor<16x32xf32, #blocked1>)", "(tensor<16x32xf32, #blocked>)"))
    assert moved[0] != r[0] and moved[1:] == r[1:]


def test_reductions_are_matched_by_source_line():
    """A reduction keeps its layout where taps on has, at its source line, only layouts that taps off has
    there; a line only taps on has is tap-only code (the tap variant's extra reductions may come anywhere)."""
    defs = {"#loc3": 'loc("/k/prepare_bwd.py":300:20)', "#loc4": 'loc("/k/prepare_bwd.py":500:9)',
            "#loc7": "loc(callsite(#loc8 at #loc4))", "#loc8": 'loc("b_a"(#loc3))'}
    assert source("#loc7", defs) == "prepare_bwd.py:300:20" and source("#loc9", defs) == "?"
    a, b = "#blocked<A>", "#blocked<B>"
    off = [("reduce axis 0", "16x32xf32", a, "p.py:300:20"), ("scan axis 0", "64x32xf32", a, "p.py:410:5")]
    tap = ("reduce axis 0", "64x32xf32", b, "p.py:120:8")
    assert moved(off, [tap, off[0], off[0], off[1]]) == []            # a tap-only line, a helper used twice
    assert moved(off, [off[0], off[1][:2] + (b, off[1][3])]) == ["scan axis 0 of 64x32xf32 at p.py:410:5: "
                                                                 "#blocked<A> -> #blocked<B>"]
    assert moved(off, [off[0]]) == ["scan axis 0 of 64x32xf32 at p.py:410:5: taps on has no such reduction"]


DOTS = """
    %cst_7 = arith.constant dense<0.000000e+00> : tensor<64x32xf32, #mma>
    %s = tt.dot %m, %x, %cst_7 : tensor<64x64xf32, #dot0> * tensor<64x32xf32, #dot1> -> tensor<64x32xf32, #mma> loc(#loc9)
    %r = tt.dot %m, %y, %s : tensor<64x64xf32, #dot0> * tensor<64x32xf32, #dot1> -> tensor<64x32xf32, #mma> loc(#loc10)
    %w = ttng.warp_group_dot %a, %b, %r {inputPrecision = 0 : i32, isAsync = true} : tensor<64x16xf32, #dot0> * !ttg.memdesc<16x32xf32, #shared, #smem> -> tensor<64x32xf32, #mma> loc(#loc11)
"""


def test_accumulating_dots_lists_the_products_that_carry_an_add():
    """Round 22: taps in fp32 mode used the K pass's prefix product a second time, Triton then no longer
    folded the add after it into its accumulator, and dg changed in its last bits on the H200."""
    d = accumulating_dots(DOTS)
    assert [x.split()[0] for x in d] == ["tt.dot", "ttng.warp_group_dot"]
    assert d[0] == "tt.dot tensor<64x64xf32, > * tensor<64x32xf32, > -> tensor<64x32xf32, >"
    unfolded = DOTS.replace("%y, %s :", "%y, %cst_7 :")
    assert accumulating_dots(unfolded) == d[1:]


@pytest.mark.parametrize("chunk,K,V", [(16, 72, 40), (64, 128, 128), (32, 8, 12)])  # K = 8: padded dot blocks
def test_taps_keep_every_reduction_layout(chunk, K, V):
    p = run_script("layout_check.py", "--chunk-size", str(chunk), "--K", str(K), "--V", str(V))
    assert p.returncode == 0 and "taps leave every reduction's layout and every product's accumulator unchanged" \
        in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("precision,K,taps", [("bf16", 128, True), ("fp32", 256, False)])
def test_every_launch_fits_in_shared_memory(precision, K, taps):
    """The state passes' pipeline depth comes from a byte count (tuning.pipeline_stages); compiled for
    sm_90, no launch may need more shared memory than an H200 grants (Triton refuses such a launch on
    the GPU: three stages of the forward state pass at H = 32 needed 245760 bytes)."""
    p = run_script("kernel_resources.py", "--precision", precision, "--K", str(K), "--V", str(K),
                   *(["--taps"] if taps else []))
    lines = [x for x in p.stdout.splitlines() if "SMEM:" in x]
    # nine launches with taps off (the state pass forms o: the output pass runs only for taps), ten with
    assert p.returncode == 0 and len(lines) >= (10 if taps else 9), p.stdout + p.stderr
    assert not [x for x in lines if x.endswith(" OVER")], p.stdout
    smem = {x.split()[0]: int(x.rsplit("SMEM:", 1)[1]) for x in lines}
    assert smem["kda_fwd_recurrence_kernel"] > 0 and smem["recurrence_bwd_kernel"] > 0


def test_the_inference_forward_with_row_scales_compiles_without_spills():
    """bf16 mode's inference forward reads q, k through the row scales, rounding q * rq to fp16
    (prepare.rowscale_for_inference): at chunk 16 its four launches compile for sm_90, the intra and WY kernels
    spill nothing. (At chunk 64 the intra kernel spills with or without them: 72 bytes of stack training, 120
    inference, benchmarks/kernel_resources.py --chunk-size 64 --setting lower_bound [--infer].)"""
    p = run_script("kernel_resources.py", "--chunk-size", "16", "--infer", "--setting", "lower_bound")
    lines = [x for x in p.stdout.splitlines() if "SMEM:" in x]
    assert p.returncode == 0 and [x.split()[0] for x in lines] == [
        "kda_fwd_token_kernel", "kda_fwd_intra_solve_kernel", "kda_fwd_wu_kernel", "kda_fwd_recurrence_kernel"], \
        p.stdout + p.stderr
    assert all(" STACK:0 " in x and not x.endswith(" OVER") for x in lines), p.stdout


def test_exp_ftz_drops_the_subnormal_fixup_and_nothing_else(monkeypatch):
    """EXP_FTZ=1 (tlmath.exp_, read at import: a process per value) takes exp as ex2.approx.ftz: the same
    exponentials (MUFU) in the kernels that form them, fewer compares (FSETP: the fix-up's) and instructions."""
    counts = {}
    for ftz in ("0", "1"):
        monkeypatch.setenv("KDADBG_EXP_FTZ", ftz)
        p = run_script("kernel_resources.py", "--setting", "lower_bound", "--op", "--sass", "--only", "token", "intra",
                       "dqkg_kernel")
        assert p.returncode == 0, p.stdout + p.stderr
        counts[ftz] = {x.split()[0]: dict(kv.split(":") for kv in x.split() if kv.split(":")[0] in
                                          ("INSTR", "MUFU", "FSETP")) for x in p.stdout.splitlines() if "INSTR:" in x}
    assert set(counts["0"]) == set(counts["1"]) == {"kda_fwd_token_kernel", "kda_fwd_intra_solve_kernel",
                                                    "chunk_bwd_dqkg_kernel"}, counts
    for name, off in counts["0"].items():
        on = counts["1"][name]
        assert on["MUFU"] == off["MUFU"] and int(off["MUFU"]) > 0, (name, off, on)
        assert int(on["FSETP"]) < int(off["FSETP"]) and int(on["INSTR"]) < int(off["INSTR"]), (name, off, on)


LOOP = """    %r:3 = scf.for %i = %c0 to %n step %c1 iter_args(%a = %x, %p = %y, %s = %z) -> (f32, f32, f32) {
      %t = tt.load %ptr_t, %m : tensor<128x!tt.ptr<f32>, #blocked>
      %c = ttg.async_copy_global_to_local %ptr_c, %buf mask %m : tensor<64x16x!tt.ptr<f32>, #blocked1>
      %w = ttg.async_wait %c {num = 2 : i32}
      %nx = tt.load %ptr_n, %m : tensor<128x!tt.ptr<f32>, #blocked>
      %u = arith.mulf %t, %p : tensor<128xf32, #blocked>
      scf.if %cond {
        %k = tt.load %ptr_k : !tt.ptr<i32>
      }
      scf.yield %u, %nx, %s : f32, f32, f32
    } loc(#loc1)
"""


def test_loop_check_tells_a_waited_load_from_a_prefetch():
    """%t is used in its own step (waited on), %nx only goes to scf.yield (the next step's prefetch);
    %k, a load inside a nested region that nothing uses, is not waited on."""
    (body,) = loop_bodies(LOOP)
    assert len(body) == 9 and body[-1].lstrip().startswith("scf.yield")
    assert waited_loads(body) == ["%t"]
    assert waited_loads([x.replace("%u = arith.mulf %t, %p", "%u = arith.mulf %p, %p") for x in body]) == []


@pytest.mark.parametrize("taps", [False, True])
def test_state_pass_steps_wait_on_no_load(taps):
    """Round 15: the state passes' steps waited on the chunk table and on gT/dU0 loads (2.2x fla's time
    for the backward pass on the H200); ``loop_check.py`` flags that code (it exits 1 on 1a36423). With
    taps on, the backward's step loaded the head's tap slot (flagged on 6a900b7). With taps on the backward
    state pass has a second loop, the NaN fill a short chain's steps left (it loads nothing); each state
    pass's step keeps its pipelined tile copies."""
    p = run_script("loop_check.py", *(["--taps"] if taps else []))
    assert p.returncode == 0 and "no state-pass step waits on a load" in p.stdout, p.stdout + p.stderr
    loops = [x for x in p.stdout.splitlines() if "loads waited on in the step:" in x]
    assert len(loops) == (3 if taps else 2) and all(x.endswith(": none") for x in loops), p.stdout
    assert sum("tile copies=4" in x for x in loops) == 2, p.stdout


@pytest.mark.parametrize("taps", [False, True])
def test_the_fused_state_pass_steps_wait_on_no_load(taps):
    """With ``FWD_FUSE_WU=1`` the forward state pass reads ``v`` (bf16) where it read ``u`` (fp32), one step
    ahead at H16 (``REC_U_AHEAD``): converted to fp32 in the step that loaded it, the step waited on the load
    (``loop_check.py`` flagged it on fc2385d); the loaded tile now stays bf16 until its use."""
    p = run_script("loop_check.py", *(["--taps"] if taps else []), knobs={"FWD_FUSE_WU": "1"})
    assert p.returncode == 0 and "no state-pass step waits on a load" in p.stdout, p.stdout + p.stderr
    fwd = [x for x in p.stdout.splitlines() if x.startswith("kda_fwd_recurrence_kernel")]
    assert len(fwd) == 1 and fwd[0].endswith(": none") and "tile copies=5" in fwd[0], p.stdout
