"""Triton kernels for chunked KDA, with optional per-chunk taps (import name ``kdadbg_kernels``)."""

from .taps import GRADIENTS, OUTPUTS, REGISTRY, STAGES, TAP_NAMES, TAPS, Tap, TapSelection, alloc_tap_buffers

__all__ = ["GRADIENTS", "OUTPUTS", "REGISTRY", "STAGES", "TAP_NAMES", "TAPS", "Tap", "TapSelection",
           "alloc_tap_buffers"]
