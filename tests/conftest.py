"""Test setup: without a GPU, kernels run under the Triton interpreter on CPU tensors.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates, so it is set here, before any test
module imports the kernels package.
"""

import os
import pathlib

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"  # where kernel tests put their tensors
REPO = pathlib.Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
GOLDEN = REPO / "tests" / "golden"  # copied from shared/golden

gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _hand_back_gpu_memory():
    """After each test on a GPU, the memory torch's caching allocator keeps for this process goes back to the
    driver: pytest-xdist's workers share one GPU, and a worker's cache (41 GB of an H100's 80 after the
    model-size tests, docs/gpu/round54/call7) is memory the others' checks see as taken. Nothing on a CPU."""
    yield
    if HAS_GPU:
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def png_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` from a PNG's signature and IHDR chunk; ValueError when it is not a PNG."""
    import struct

    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def kernel_device():
    return "cuda" if HAS_GPU else "cpu"


def resave(src, dst, edit=None, **metadata) -> dict:
    """Copy the safetensors file ``src`` to ``dst`` with its metadata (``metadata`` keys replaced), after
    ``edit(tensors)`` changes the tensors in place; returns the tensors written."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(src), "pt") as f:
        meta = {**(f.metadata() or {}), **metadata}
    tensors = load_file(str(src))
    if edit is not None:
        edit(tensors)
    save_file(tensors, str(dst), metadata=meta)
    return tensors


def scaled_output(impl, name: str, factor: float):
    """``impl`` (an Implementation) with its output ``name`` multiplied by ``factor`` on every run: a planted
    fault of one output (a wrong reduction, say) on top of a correct implementation. Returns ``impl``."""
    run0 = impl.run

    def run(inputs, config, *, device, taps=None):
        r = run0(inputs, config, device=device, taps=taps)
        r.outputs[name] = r.outputs[name] * factor
        return r

    impl.run = run
    return impl
