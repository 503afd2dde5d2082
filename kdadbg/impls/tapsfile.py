"""``--against FILE`` (or ``--impl FILE``): another implementation's results, read from a taps file
(README, "Taps file layout"): its outputs and gradients and whatever taps it holds, in its own state
layout and gate units (a :class:`~.base.TapsSpec`), converted to the registry's. Nothing can be rerun,
so the origin of a divergence (made here or carried in) is not available."""

from __future__ import annotations

from pathlib import Path

import torch

from kdadbg_kernels.taps import REGISTRY, TapSelection

from ..chunks import chunk_table
from ..config import KDAConfig, KDAInputs
from ..errors import KdadbgError
from ..tapsfile import FORMAT
from .base import Implementation, ImplRun, TapsSpec, convert_taps, select_taps


def output_shapes(inputs: KDAInputs, config: KDAConfig) -> dict[str, tuple[int, ...]]:
    """The dump's shape of every output and gradient (``ht``/``dh0`` in its state layout): dq, dk over
    the q/k heads H, everything else over the value heads HV."""
    B, T, H, K, V = inputs.shape
    HV, N = inputs.HV, inputs.n_seqs
    state = (N, HV, V, K) if config.state_layout == "vk" else (N, HV, K, V)
    return {"o": (B, T, HV, V), "ht": state, "dq": (B, T, H, K), "dk": (B, T, H, K), "dv": (B, T, HV, V),
            "dg": (B, T, HV, K), "dbeta": (B, T, HV), "dh0": state, "dA_log": (HV,), "ddt_bias": (HV, K)}


def checked_outputs(where: str, outputs: dict[str, torch.Tensor], inputs: KDAInputs, config: KDAConfig
                    ) -> dict[str, torch.Tensor]:
    """Outputs with the dump's shapes (``ddt_bias`` may be fla's flat ``[H*K]``); one line otherwise."""
    want = output_shapes(inputs, config)
    out = {}
    for name, t in outputs.items():
        if name not in want or t is None:
            continue
        if name == "ddt_bias" and t.ndim == 1 and t.numel() == want[name][0] * want[name][1]:
            t = t.reshape(want[name])
        if tuple(t.shape) != want[name]:
            raise KdadbgError(f"{where}: output '{name}': expected shape [{','.join(map(str, want[name]))}] "
                              f"(the dump's), found [{','.join(map(str, t.shape))}]")
        if not t.is_floating_point():
            raise KdadbgError(f"{where}: output '{name}': expected a real float dtype, found "
                              f"{str(t.dtype).removeprefix('torch.')}")
        if t.device.type == "meta":
            raise KdadbgError(f"{where}: output '{name}': expected a tensor with values (on the CPU or a GPU), "
                              f"found a meta tensor (shape only, no data)")
        out[name] = t
    return out


def written_precision_note(path, metadata: dict, precision: str) -> str | None:
    """A note where a taps file says it was written at the other of kdadbg's precisions (``run --save``,
    ``taps --source ours`` record it) than the one it is judged at: its values then meet the other mode's
    tolerances (a bf16 file judged at fp32 is a wall of BUG), and ``--precision`` says which to use."""
    own = str(metadata.get("precision", "")).strip()
    if own not in ("fp32", "bf16") or own == precision:
        return None
    return (f"{path} was written at precision {own} (its metadata) and is judged here at --precision "
            f"{precision}'s tolerances and noise floor: for its own mode's, use --precision {own}")


class TapsFile(Implementation):
    kind = "taps file"
    takes_initial_state = False
    provides_taps = True

    def __init__(self, path, spec: TapsSpec = TapsSpec(), precision: str = "fp32"):
        self.path, self.spec, self.precision = str(path), spec, precision
        self.name = self.path
        self._file = None
        self._inputs_checked = None

    def describe(self) -> dict:
        return {**super().describe(), "path": self.path, "state_layout": self.spec.state_layout,
                "gate_units": self.spec.gate_units}

    def read(self) -> dict:
        if self._file is None:
            from safetensors import safe_open

            from ..tapsfile import read_taps_file

            p = Path(self.path)
            if p.is_file():
                try:
                    with safe_open(str(p), framework="pt") as f:
                        meta, keys = f.metadata() or {}, set(f.keys())
                except Exception:
                    meta, keys = {}, set()
                if meta.get("format") != FORMAT and {"q", "k", "v", "do"} <= keys:
                    raise KdadbgError(f"{self.path}: is a dump (format v1), not a taps file; write one with "
                                      f"`kdadbg taps DUMP -o FILE` or compare implementations with --impl")
            self._file = read_taps_file(self.path, self.spec.state_layout)
        return self._file

    def run(self, inputs: KDAInputs, config: KDAConfig, *, device: str, taps: TapSelection | None = None) -> ImplRun:
        f = self.read()
        if self._inputs_checked is not inputs:
            self.check_inputs(inputs, config)
        B, T, _, K, V = inputs.shape
        H = inputs.HV   # taps are per value head
        ct = chunk_table(B, T, inputs.cu_seqlens, config.chunk_size)
        if f["chunks"]:
            self._check_chunks(f, ct, config)
            bad = [int(h) for h in f["heads"] if not 0 <= int(h) < H]
            if bad:
                raise KdadbgError(f"{self.path}: head.index {bad[0]} out of range; the dump has {H} value heads "
                                  f"(0..{H - 1})")
        from ..window import WINDOW_NOT_COMPARABLE

        outputs = checked_outputs(self.path, f["outputs"], inputs, config)
        # a file made on a window (run --chunks A:B --save) cannot hold the whole-head sums: not a shortfall
        not_provided = {n: WINDOW_NOT_COMPARABLE for n in ("dA_log", "ddt_bias")
                        if n not in outputs and f["metadata"].get("chunks")}
        if f["metadata"].get("source") == "capture" and "ht" not in outputs:
            from ..dump import NOT_ASKED

            not_provided["ht"] = NOT_ASKED   # the training call returned none: not a shortfall
        notes = [n for n in [written_precision_note(self.path, f["metadata"], self.precision)] if n]
        if taps is None or not f["chunks"]:
            return ImplRun(outputs, not_provided=not_provided, notes=notes)
        ids = [int(i) for i in f["chunks"]["index"]]
        heads = [int(h) for h in f["heads"]]
        theirs = {n: f["taps"][n] for n in taps.names if n in f["taps"]}
        for n, t in theirs.items():
            shape = REGISTRY[n].dims(config.chunk_size, K, V)
            if self.spec.state_layout == "vk" and n in ("S", "dS"):
                shape = shape[::-1]
            if tuple(t.shape[2:]) != tuple(shape):
                raise KdadbgError(f"{self.path}: tap.{n}: per-chunk shape {list(t.shape[2:])}, expected "
                                  f"{list(shape)} (C={config.chunk_size}, K={K}, V={V}, state layout "
                                  f"{self.spec.state_layout})")
        lo, hi = taps.chunk_range(ct.n_chunks)
        sel, rows, hs = select_taps(convert_taps(theirs, self.spec), ids, heads, list(range(lo, hi)),
                                    list(taps.head_list(H)))
        return ImplRun(outputs, sel, rows, hs, not_provided=not_provided, notes=notes)

    def check_inputs(self, inputs: KDAInputs, config: KDAConfig | None = None) -> None:
        """A file that records its inputs' digest (``inputs_sha256``: ``kdadbg taps``, ``run --save``,
        ``capture``) must have been made from this dump's inputs; one without it (an older kdadbg's, or
        another tool's) is taken on trust. Called by ``check_supported``, before any work."""
        from ..tapsfile import CONFIG_KEYS, config_differences, config_overrides, inputs_fingerprint

        f = self.read()
        if config is not None:
            keys = (*CONFIG_KEYS, "chunk_size")   # every differing key in one line (chunk_size too)
            diffs = config_differences(f["metadata"], config.to_metadata(), keys)
            if diffs:
                fix = config_overrides(f["metadata"], config.to_metadata(), keys)
                raise KdadbgError(f"{self.path}: made with another config than this dump's (file / dump: "
                                  f"{'; '.join(diffs)}): compare a file with the dump and config it was made from "
                                  f"(with this dump, the file's config is the overrides {fix})")
        want = f["metadata"].get("inputs_sha256")
        if want is None:
            self._inputs_checked = inputs
            return
        have = inputs_fingerprint(inputs)
        if want != have:
            made = f["metadata"].get("dump")
            raise KdadbgError(f"{self.path}: made from other inputs than this dump (its inputs_sha256 {want[:12]}…, "
                              f"the dump's {have[:12]}…{f'; it names dump {made!r}' if made else ''}): compare a file "
                              f"with the dump it was made from")
        self._inputs_checked = inputs

    def _check_chunks(self, f: dict, ct, config: KDAConfig) -> None:
        meta_c = f["metadata"].get("chunk_size")
        if meta_c is not None and str(meta_c).strip() != str(config.chunk_size):
            raise KdadbgError(f"{self.path}: chunk_size {meta_c} in its metadata, but the dump uses {config.chunk_size}")
        ch = f["chunks"]
        for i, c in enumerate(int(x) for x in ch["index"]):
            if not 0 <= c < ct.n_chunks:
                raise KdadbgError(f"{self.path}: chunk.index {c} out of range; the dump has {ct.n_chunks} chunks")
            if int(ch["len"][i]) != int(ct.length[c]) or int(ch["seq"][i]) != int(ct.seq[c]):
                raise KdadbgError(f"{self.path}: chunk {c}: seq {int(ch['seq'][i])}, len {int(ch['len'][i])} in the "
                                  f"file, but seq {int(ct.seq[c])}, len {int(ct.length[c])} in the dump (another "
                                  f"chunk size or sequence layout?)")
