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


@pytest.fixture
def kernel_device():
    return "cuda" if HAS_GPU else "cpu"
