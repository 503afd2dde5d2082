"""Test-only planted faults: one known bug in one chunk, to prove ``kdadbg diff`` finds it.

The production kernels hold no fault code. A fault is a few edits of one stage module of
``kdadbg_kernels`` (an exact piece of its source and what replaces it, ``CHUNK`` standing for the
planted chunk); ``plant(name, chunk)`` applies them to a copy of the module's source, imports the copy
beside the package (``kdadbg_kernels._fault_<name>_<chunk>``) and, while it is active, has the
orchestrator (``chunk.py`` for the forward, ``chunk_bwd.py`` for the backward) call the copy's stage
function instead of the real one. An edit that no longer matches the source raises, so a change to the
kernels cannot silently disarm a fault (``tests/test_diff.py`` applies every one).

Like a real bug, a planted fault follows the chunk's data: the first call after ``plant`` records the
planted chunk's first token (its raw ``q`` row); later calls (``diff``'s window rerun on a slice of the
sequence) apply the fault to the chunk that starts with that token, or to none.

=================  =============  =========================================================  =============
name               stage module   what the kernel does wrong in the planted chunk            first bad tap
=================  =============  =========================================================  =============
dL_sign            prepare_bwd    ``dL`` with the wrong sign                                 dL
dS_untransposed    recurrence_bwd ``dS`` passed on transposed (needs K == V in one block)    dS
gate_padding       prepare        padding rows' decay not masked, gT = the tile's last row   gT
dgT_after_update   prepare_bwd    ``dgT`` reads ``dS`` after the update (not the one         dgT
                                  arriving from the next chunk)
ln2_twice          prepare_bwd    ln 2 applied to the gate gradient a second time            dgc
varlen_offset      prepare        inputs loaded one token late, from that chunk on           gc
=================  =============  =========================================================  =============
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Fault:
    module: str                       # stage module of kdadbg_kernels holding the faulty kernel
    entry: str                        # its host function, as the orchestrator calls it
    backward: bool                    # orchestrator: chunk_bwd.kda_backward (else chunk.kda_forward's stage)
    edits: tuple[tuple[str, str], ...]
    tap: str                          # the first tap it makes wrong


_V_PASS_LAUNCH = ("        chunk_bwd_dqkg_v_kernel[chunk_grid(c1 - c0, H, cdiv(K, BK), first=hf, grid=(cdiv(K, BK), c1 - c0, "
                  "H))](\n")

FAULTS: dict[str, Fault] = {
    "dL_sign": Fault("prepare_bwd", "chunk_bwd_dqkg", True, (
        ("        b_dL = tl.where((o_t[:, None] > o_t[None, :]) & m_tt, -b_dL, 0.)\n",
         "        b_dL = tl.where((o_t[:, None] > o_t[None, :]) & m_tt, -b_dL, 0.)\n"
         "        b_dL = tl.where(i_c == CHUNK, -b_dL, b_dL)\n"),
    ), "dL"),
    "dS_untransposed": Fault("recurrence_bwd", "recurrence_bwd", True, (
        ("        b_dU0, b_gT = b_dU0_prev, b_gT_prev\n",
         "        b_dU0, b_gT = b_dU0_prev, b_gT_prev\n"
         "        b_dS = tl.where(c == CHUNK, tl.trans(b_dS), b_dS)\n"),
    ), "dS"),
    "gate_padding": Fault("prepare", "kda_fwd_prepare", False, (
        ("        b_gc = tl.cumsum(b_gam, axis=0).to(tl.float32)\n",
         "        b_gam = tl.where((i_c == CHUNK) & m_k[None, :],\n"
         "                         gate_act(b_g.to(b_gam.dtype), b_dt.to(b_gam.dtype), a_h, lower_bound, GATE), b_gam)\n"
         "        b_gc = tl.cumsum(b_gam, axis=0).to(tl.float32)\n"),
        ("        b_gT = tl.sum(tl.where((o_t == n_valid - 1)[:, None], b_gc, 0.0), 0)\n",
         "        b_gT = tl.sum(tl.where((o_t == n_valid - 1)[:, None], b_gc, 0.0), 0)\n"
         "        b_gT = tl.where(i_c == CHUNK, tl.sum(tl.where((o_t == BC - 1)[:, None], b_gc, 0.0), 0), b_gT)\n"),
    ), "gT"),
    # the V pass forms the dS leaving the chunk (exp(gT) dS⁺ + qd^T dO - kd^T Diag(b) dvcorr) and adds
    # rowsum((dS - dS⁺) ⊙ S) to the planted chunk's rowsum(dS⁺ ⊙ S); it takes gc, qn, kn (their row
    # scales rq, rk with F_RS: prepare.qk_rowscale), gT, scale for that
    "dgT_after_update": Fault("prepare_bwd", "chunk_bwd_dqkg", True, (
        ("def chunk_bwd_dqkg_v_kernel(\n",
         "def chunk_bwd_dqkg_v_kernel(\n    gc, qn, kn, rq, rk, gT, scale, F_RS: tl.constexpr,\n"),
        ("    b_dbv = tl.zeros([C], dtype=tl.float32)\n    for i_v in range(tl.cdiv(V, BV)):\n",
         "    b_dbv = tl.zeros([C], dtype=tl.float32)\n"
         "    f_gT = tl.load(gT + o_ch * K + o_k, mask=m_k, other=0.)\n"
         "    f_E = tl.exp(tl.load(gc + o_tk, mask=m_tk, other=0.))\n"
         "    f_qd = tl.where(m_tk, scale * load_qk(qn, o_tk, m_tk, rq, (bos + o_t) * H + i_h, m_t, F_RS) * f_E, 0.)\n"
         "    f_kd = tl.where(m_tk, load_qk(kn, o_tk, m_tk, rk, (bos + o_t) * H + i_h, m_t, F_RS) * f_E, 0.)\n"
         "    for i_v in range(tl.cdiv(V, BV)):\n"),
        ("        b_dgTs += tl.sum(b_dSp * b_S.to(tl.float32), axis=1)\n",
         "        b_dgTs += tl.sum(b_dSp * b_S.to(tl.float32), axis=1)\n"
         "        f_dS = (tl.exp(f_gT)[:, None] * b_dSp + mm(tl.trans(f_qd), b_do, DOT)\n"
         "                - mm(tl.trans(f_kd), b_b[:, None] * b_dvc, DOT))\n"
         "        b_dgTs += tl.where(i_c == CHUNK, tl.sum((f_dS - b_dSp) * b_S.to(tl.float32), axis=1), 0.)\n"),
        (_V_PASS_LAUNCH, _V_PASS_LAUNCH + "            gc=gc, qn=qn, kn=kn, rq=b if rq is None else rq,\n"
                                          "            rk=b if rk is None else rk, gT=gT, scale=scale, F_RS=rq is not None,\n"),
    ), "dgT"),
    "ln2_twice": Fault("prepare_bwd", "chunk_bwd_dqkg", True, (
        ("    b_dgx += b_kn * (b_Ed - b_Ei)                 # dgc without the kr path\n",
         "    b_dgx += b_kn * (b_Ed - b_Ei)                 # dgc without the kr path\n"
         "    b_dgx = tl.where(i_c == CHUNK, b_dgx * 0.6931471805599453, b_dgx)\n"),
    ), "dgc"),
    # every input of the forward prepare (q, k, v, g, beta) read one token late from the planted chunk on
    "varlen_offset": Fault("prepare", "kda_fwd_prepare", False, (
        ("    dev, f32 = q.device, torch.float32\n",
         "    dev, f32 = q.device, torch.float32\n"
         "    q, k, v, g, beta = (shift_rows(x, chunks, CHUNK) for x in (q, k, v, g, beta))\n"),
    ), "gc"),
}


def shift_rows(x: torch.Tensor, chunks, first: int) -> torch.Tensor:
    """``x`` [BT, ...] with each row of the chunks from ``first`` on replaced by the next row of its chunk
    (0 for a chunk's last valid row): what a kernel that loads one token late reads."""
    start = chunks.chunk_start.detach().to("cpu", torch.long)[first:]
    length = chunks.chunk_len.detach().to("cpu", torch.long)[first:]
    out = x.clone()
    for s, n in zip(start.tolist(), length.tolist()):
        out[s:s + n - 1] = x[s + 1:s + n]
        out[s + n - 1] = 0
    return out


_dir: Path | None = None
_modules: dict[tuple[str, int], object] = {}


def faulty_module(name: str, chunk: int):
    """The stage module of fault ``name`` with its edits applied for global chunk ``chunk`` (cached)."""
    global _dir
    if (name, chunk) in _modules:
        return _modules[name, chunk]
    fault = FAULTS[name]
    real = importlib.import_module(f"kdadbg_kernels.{fault.module}")
    src = Path(real.__file__).read_text()
    for old, new in fault.edits:
        n = src.count(old)
        if n != 1:
            raise RuntimeError(f"fault {name}: expected kernels/{fault.module}.py to hold {old.strip()!r} once, "
                               f"found it {n} times; update tests/kernel_faults.py")
        src = src.replace(old, new.replace("CHUNK", str(chunk)))
    if _dir is None:
        _dir = Path(tempfile.mkdtemp(prefix="kdadbg_faults_"))
        atexit.register(shutil.rmtree, _dir, True)
    mod_name = f"kdadbg_kernels._fault_{name}_{chunk}"
    path = _dir / f"{fault.module}_{name}_{chunk}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(mod_name, path)
    mod = importlib.util.module_from_spec(spec)
    mod.shift_rows = shift_rows
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    _modules[name, chunk] = mod
    return mod


class _Binding:
    """The planted chunk in each run: the first run's chunk ``chunk``, then the chunk whose first raw ``q``
    row equals that chunk's (-1: none)."""

    def __init__(self, chunk: int):
        self.chunk, self.key = chunk, None
        self.bound = False

    def resolve(self, q: torch.Tensor, chunk_start: torch.Tensor) -> int:
        starts = chunk_start.detach().to("cpu", torch.long)
        rows = q.detach().reshape(-1, *q.shape[-2:]).to("cpu")[starts]
        if not self.bound:
            self.bound = True
            self.key = rows[self.chunk].clone() if 0 <= self.chunk < len(starts) else None
            return self.chunk if self.key is not None else -1
        if self.key is None:
            return -1
        hits = [c for c in range(len(starts)) if torch.equal(rows[c], self.key)]
        return hits[0] if hits else -1


@contextmanager
def plant(name: str, chunk: int):
    """Plant fault ``name`` at global chunk ``chunk`` of the next run (and of any rerun on its data)."""
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    from kdadbg_kernels import chunk as fwd, chunk_bwd as bwd

    fault, binding = FAULTS[name], _Binding(chunk)
    if fault.backward:
        ns, attr = bwd, "kda_backward"
        real_entry, real_bwd = getattr(bwd, fault.entry), bwd.kda_backward

        def hooked(saved, chunks, q, *args, **kw):
            c = binding.resolve(q, chunks.chunk_start)
            setattr(bwd, fault.entry, getattr(faulty_module(name, c), fault.entry) if c >= 0 else real_entry)
            try:
                return real_bwd(saved, chunks, q, *args, **kw)
            finally:
                setattr(bwd, fault.entry, real_entry)
    else:
        ns, attr = fwd, fault.entry
        real_stage = getattr(fwd, fault.entry)

        def hooked(q, k, v, g, beta, chunks, **kw):
            c = binding.resolve(q, chunks.chunk_start)
            stage = getattr(faulty_module(name, c), fault.entry) if c >= 0 else real_stage
            return stage(q, k, v, g, beta, chunks, **kw)
    real = getattr(ns, attr)
    setattr(ns, attr, hooked)
    try:
        yield
    finally:
        setattr(ns, attr, real)
