"""Where this test process runs Triton kernels: on CUDA tensors where a GPU exists, else on CPU tensors under the
Triton interpreter (the kernels' and models' conftests set TRITON_INTERPRET=1 without CUDA)."""

from __future__ import annotations

import os

import pytest
import torch

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Tests that force Triton onto CPU tensors need the interpreter (on a GPU host the gpu-marked tests cover them).
needs_interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton on CPU tensors needs TRITON_INTERPRET=1"
)
