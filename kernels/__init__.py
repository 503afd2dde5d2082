"""Triton kernels for chunked KDA, with optional per-chunk taps (import name ``kdadbg_kernels``).

The kernel entry points (``chunk_kda``, ``kda_forward``, ``kda_forward_backward``) load lazily:
Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, so importing the registry must not
compile anything.
"""

from .taps import GRADIENTS, OUTPUTS, REGISTRY, STAGES, TAP_NAMES, TAPS, Tap, TapSelection, alloc_tap_buffers

_LAZY = ("chunk_kda", "kda_forward", "kda_forward_backward", "DeviceError")

__all__ = ["GRADIENTS", "OUTPUTS", "REGISTRY", "STAGES", "TAP_NAMES", "TAPS", "Tap", "TapSelection",
           "alloc_tap_buffers", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        from . import chunk

        return getattr(chunk, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
