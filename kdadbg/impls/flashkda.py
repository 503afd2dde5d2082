"""``--impl flashkda``: MoonshotAI's FlashKDA CUDA kernels, with their own buffers as taps.

Two builds (``benchmarks/build_flashkda.sh`` builds either; put its tree on ``PYTHONPATH``):

* the fork with a backward (yyq0210/FlashKDA, ``flash_kda.autograd.flash_kda_func``): outputs and every
  gradient through ``flash_kda_func`` and autograd; with kdadbg's patch (``flashkda_fork_taps.patch``,
  applied by the build script) its backward workspace is kept too;
* upstream (MoonshotAI/FlashKDA at 1ce47ea, ``flash_kda.fwd``): forward only, ``o`` and ``ht``.

Taps come from a second call of the raw binding (``flash_kda_C.fwd`` / ``.bwd``) on the same inputs,
with workspaces kdadbg allocates NaN-filled and keeps; the adapter checks that this call reproduces
the public entry point's outputs bit for bit (a note says so, or says where it does not). The buffers
become registry taps in :mod:`.flashkda_convert` (table there and in the README).

FlashKDA needs K = V = 128, bf16 inputs, the lower-bound gate with l2norm and beta sigmoid, CUDA; it
works in 16-token chunks, so a dump at another chunk size is compared at chunk 16 (:meth:`config_for`).
"""

from __future__ import annotations

import importlib
from dataclasses import replace

import torch

from kdadbg_kernels.taps import TapSelection

from ..chunks import chunk_table
from ..config import KDAConfig, KDAInputs
from ..errors import KdadbgError
from . import flashkda_convert as fc
from .base import Implementation, ImplRun, select_taps
from .tapsfile import checked_outputs

HOW_TO_BUILD = "build it with benchmarks/build_flashkda.sh and put the tree it prints on PYTHONPATH"
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias")


def find_build() -> tuple[str | None, str]:
    """``(build, detail)``: ``fork+patch``, ``fork``, ``upstream`` or None (detail: why not / where)."""
    try:
        flash_kda = importlib.import_module("flash_kda")
        flash_kda_C = importlib.import_module("flash_kda_C")
    except ImportError as e:
        return None, f"flash_kda is not importable ({e}); {HOW_TO_BUILD}"
    where = getattr(flash_kda, "__file__", "?")
    if not hasattr(flash_kda_C, "bwd"):
        return "upstream", where
    try:
        importlib.import_module("flash_kda.autograd")
    except ImportError as e:
        return None, f"flash_kda at {where} has a backward binding but flash_kda.autograd fails to import ({e})"
    return ("fork+patch" if hasattr(flash_kda_C, "get_bwd_workspace_size") else "fork"), where


def _state_vk(t: torch.Tensor | None, layout: str) -> torch.Tensor | None:
    """A dump-layout state as FlashKDA's fp32 ``[N,H,V,K]``."""
    if t is None:
        return None
    t = t.float()
    return (t if layout == "vk" else t.transpose(-1, -2)).contiguous()


def _from_vk(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t if layout == "vk" else t.transpose(-1, -2).contiguous()


class FlashKDA(Implementation):
    """FlashKDA at bf16 (its only precision): judged by the bf16 tolerance table and noise floor."""

    name = kind = "flashkda"
    provides_taps = True
    takes_initial_state = True
    precision = "bf16"

    def __init__(self, precision: str = "bf16"):
        self.build, self.where = find_build()

    def describe(self) -> dict:
        return {**super().describe(), "build": self.build, "where": self.where,
                "taps": list(fc.BUILD_TAPS.get(self.build, ()))}

    def config_for(self, config: KDAConfig) -> tuple[KDAConfig, str | None]:
        if config.chunk_size == fc.CHUNK:
            return config, None
        return replace(config, chunk_size=fc.CHUNK), (
            f"FlashKDA works in 16-token chunks: this dump (chunk_size {config.chunk_size}) is compared at chunk 16")

    def supports(self, config: KDAConfig, shapes: dict) -> tuple[bool, str]:
        if shapes.get("HV", shapes.get("H")) != shapes.get("H"):
            return False, (f"FlashKDA takes as many value heads as q/k heads (no GVA), found H={shapes['H']}, "
                           f"HV={shapes['HV']}")
        if shapes["K"] != fc.D or shapes["V"] != fc.D:
            return False, f"FlashKDA requires K = V = 128, found K={shapes['K']}, V={shapes['V']}"
        if config.gate != "lower_bound":
            return False, f"FlashKDA has only the lower-bound gate, found gate {config.gate}"
        if not (config.qk_l2norm and config.beta_sigmoid):
            return False, "FlashKDA always L2-normalises q, k and applies the beta sigmoid; this dump turns " \
                          f"{'qk_l2norm' if not config.qk_l2norm else 'beta_sigmoid'} off"
        if shapes["dtype"] != "bfloat16":
            return False, f"FlashKDA takes bf16 q, k, v, g, beta, found {shapes['dtype']} (write a bf16 dump: " \
                          f"kdadbg gen --dtype bfloat16)"
        if config.chunk_size != fc.CHUNK:
            return False, f"FlashKDA works in 16-token chunks, found chunk_size {config.chunk_size}"
        if self.build is None:
            return False, self.where
        return True, ""

    def run(self, inputs: KDAInputs, config: KDAConfig, *, device: str, taps: TapSelection | None = None) -> ImplRun:
        if device != "cuda":
            raise KdadbgError(f"--impl flashkda: FlashKDA runs on CUDA only, found --device {device}")
        ok, why = self.supports(config, {"K": inputs.shape[3], "V": inputs.shape[4],
                                         "dtype": str(inputs.q.dtype).removeprefix("torch.")})
        if not ok:
            raise KdadbgError(f"--impl flashkda: {why}")
        x = inputs.to(device)
        call = _Call(x, config)
        notes = [f"FlashKDA build: {self.build} ({self.where})"]
        upstream = {}
        if self.build == "upstream":
            outputs = call.forward_upstream()
            not_provided = {g: "upstream FlashKDA is forward only" for g in GRADS}
        else:
            outputs = call.forward_backward()
            not_provided = {}
            # its backward takes do in bf16 (h0, dht in fp32): run and diff give the reference the same do
            upstream = {"do": torch.bfloat16}
        outputs = checked_outputs("--impl flashkda", outputs, inputs, config)
        run = ImplRun(outputs, not_provided=not_provided, notes=notes, upstream=upstream)
        if taps is not None:
            self._add_taps(run, call, inputs, config, taps)
        return run

    def _add_taps(self, run: ImplRun, call: "_Call", inputs: KDAInputs, config: KDAConfig, sel: TapSelection):
        B, T, H, K, V = inputs.shape
        ct = chunk_table(B, T, inputs.cu_seqlens, fc.CHUNK)
        bufs = call.raw_forward(with_states=self.build != "upstream")
        same = [n for n in ("o", "ht") if n in run.outputs and n in call.raw_outputs
                and torch.equal(run.outputs[n], call.raw_outputs[n])]
        if self.build == "fork+patch":
            bufs.update(call.raw_backward())
            same += [n for n in GRADS if n in run.outputs and n in call.raw_outputs
                     and n not in ("dA_log", "ddt_bias") and torch.equal(run.outputs[n], call.raw_outputs[n])]
        checked = [n for n in run.outputs if n in call.raw_outputs and n not in ("dA_log", "ddt_bias")]
        differ = [n for n in checked if n not in same]
        run.notes.append("taps: a second call of the raw binding with kept NaN-filled workspaces; it gives "
                         + ("the same bits for " + ", ".join(checked) if not differ else
                            "other bits than the public call for " + ", ".join(differ) + " (taps may not match)"))
        names = [n for n in sel.names if n in fc.BUILD_TAPS[self.build]]
        theirs = fc.convert(bufs, ct.length, names)
        lo, hi = sel.chunk_range(ct.n_chunks)
        run.taps, run.tap_chunks, run.tap_heads = select_taps(theirs, list(range(ct.n_chunks)), list(range(H)),
                                                              list(range(lo, hi)), list(sel.head_list(H)))
        run.tap_storage = {n: torch.bfloat16 for n in run.taps if n in fc.BF16_TAPS}
        missing = [n for n in sel.names if n not in fc.BUILD_TAPS[self.build]]
        if missing:
            run.notes.append(f"taps the {self.build} build does not keep: {', '.join(missing)} (README, flashkda)")


class _Call:
    """One dump's arguments in FlashKDA's conventions, and the calls made with them."""

    def __init__(self, x: KDAInputs, config: KDAConfig):
        B, T, H, K, V = x.shape
        self.x, self.config = x, config
        self.B, self.T, self.H = B, T, H
        self.N = x.n_seqs
        self.varlen = x.cu_seqlens is not None
        self.tiles = fc.total_tiles(B, T, self.N, self.varlen)
        self.bf = {n: getattr(x, n).to(torch.bfloat16).contiguous() for n in ("q", "k", "v", "g", "beta", "do")}
        self.A_log = x.A_log.float().contiguous()
        self.dt_bias = x.dt_bias.float().reshape(H, K).contiguous()
        self.h0 = _state_vk(x.h0, config.state_layout)
        self.dht = _state_vk(x.dht, config.state_layout)
        self.cu = x.cu_seqlens.to(torch.int64).contiguous() if self.varlen else None
        self.raw_outputs: dict[str, torch.Tensor] = {}
        self._ws = self._states = None

    def _outputs(self, o, ht) -> dict:
        return {"o": o, "ht": _from_vk(ht, self.config.state_layout)}

    def forward_upstream(self) -> dict:
        import flash_kda

        o = torch.empty_like(self.bf["v"])
        ht = torch.empty(self.N, self.H, fc.D, fc.D, dtype=torch.float32, device=o.device)
        flash_kda.fwd(self.bf["q"], self.bf["k"], self.bf["v"], self.bf["g"], self.bf["beta"], self.config.scale,
                      o, self.A_log, self.dt_bias, self.config.lower_bound, initial_state=self.h0,
                      final_state=ht, cu_seqlens=self.cu)
        torch.cuda.synchronize()
        return self._outputs(o, ht)

    def forward_backward(self) -> dict:
        from flash_kda.autograd import flash_kda_func

        leaves = {n: self.bf[n].clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")}
        leaves["A_log"] = self.A_log.clone().requires_grad_(True)
        leaves["dt_bias"] = self.dt_bias.clone().requires_grad_(True)
        h0 = self.h0.clone().requires_grad_(True) if self.h0 is not None else None
        with torch.enable_grad():
            o, ht = flash_kda_func(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                                   self.config.scale, leaves["A_log"], leaves["dt_bias"], self.config.lower_bound,
                                   h0, True, self.cu)
            wrt = list(leaves.values()) + ([h0] if h0 is not None else [])
            dht = self.dht if self.dht is not None else torch.zeros_like(ht)
            got = torch.autograd.grad([o, ht], wrt, [self.bf["do"], dht], allow_unused=True)
        torch.cuda.synchronize()
        out = self._outputs(o.detach(), ht.detach())
        for name, gr, leaf in zip(("dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0"), got, wrt):
            gr = torch.zeros_like(leaf) if gr is None else gr.detach()
            out[name] = _from_vk(gr, self.config.state_layout) if name == "dh0" else gr
        return out

    def raw_forward(self, with_states: bool) -> dict[str, torch.Tensor]:
        """``flash_kda_C.fwd`` with a kept NaN-filled workspace (and ``all_states`` for the fork)."""
        import flash_kda_C

        dev = self.bf["q"].device
        size = flash_kda_C.get_workspace_size(self.B * self.T, self.H, self.N)
        self._ws = torch.full((size,), 0xFF, dtype=torch.uint8, device=dev)   # 0xFF..: NaN in bf16 and fp32
        o = torch.empty_like(self.bf["v"])
        ht = torch.empty(self.N, self.H, fc.D, fc.D, dtype=torch.float32, device=dev)
        kw = dict(initial_state=self.h0, final_state=ht, cu_seqlens=self.cu)
        if with_states:
            self._states = torch.full((self.H * self.tiles, fc.D, fc.D), float("nan"), dtype=torch.bfloat16,
                                      device=dev)
            kw["all_states"] = self._states
        flash_kda_C.fwd(self.bf["q"], self.bf["k"], self.bf["v"], self.bf["g"], self.bf["beta"],
                        float(self.config.scale), o, self._ws, self.A_log, self.dt_bias,
                        float(self.config.lower_bound), **kw)
        torch.cuda.synchronize()
        self.raw_outputs.update(self._outputs(o, ht))
        build = "fork" if with_states else "upstream"
        bufs = fc.split_workspace(self._ws, fc.FWD_SECTIONS[build], self.H, self.tiles)
        if with_states:
            bufs["S"] = self._states.view(self.H, self.tiles, fc.D, fc.D)
        return bufs

    def raw_backward(self) -> dict[str, torch.Tensor]:
        """``flash_kda_C.bwd`` after :meth:`raw_forward`, as the fork's autograd calls it, with a kept
        NaN-filled backward workspace (the taps patch's ``bwd_workspace``)."""
        import flash_kda_C

        dev = self.bf["q"].device
        size = flash_kda_C.get_bwd_workspace_size(self.B * self.T, self.H, self.N)
        bws = torch.full((size,), 0xFF, dtype=torch.uint8, device=dev)
        g = {n: torch.zeros_like(self.bf[n]) for n in ("q", "k", "v", "g", "beta")}
        dA_log, ddt_bias = torch.zeros_like(self.A_log), torch.zeros_like(self.dt_bias)
        dh0 = torch.zeros_like(self.h0) if self.h0 is not None else None
        dht = self.dht if self.dht is not None else torch.zeros(self.N, self.H, fc.D, fc.D, dtype=torch.float32,
                                                                 device=dev)
        flash_kda_C.bwd(self.bf["q"], self.bf["k"], self.bf["v"], self.bf["g"], self.bf["beta"],
                        float(self.config.scale), self._ws, self._states, self.bf["do"], self.A_log, self.dt_bias,
                        float(self.config.lower_bound), g["q"], g["k"], g["v"], g["g"], g["beta"], dA_log, ddt_bias,
                        dfinal_state=dht, dinitial_state=dh0, cu_seqlens=self.cu, bwd_workspace=bws)
        torch.cuda.synchronize()
        self.raw_outputs.update({"dq": g["q"], "dk": g["k"], "dv": g["v"], "dg": g["g"], "dbeta": g["beta"],
                                 "dA_log": dA_log, "ddt_bias": ddt_bias})
        if dh0 is not None:
            self.raw_outputs["dh0"] = _from_vk(dh0, self.config.state_layout)
        return fc.split_workspace(bws, fc.BWD_SECTIONS, self.H, self.tiles)
