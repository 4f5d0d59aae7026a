"""Fixtures for model tests: tiny HF checkpoints built once per session, HF reference models, paged batches."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # before any kernel module is imported: Triton kernels then run on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.builders import build_base

ARCHS = ["llama", "llama-tied", "llama3", "mistral", "qwen2", "qwen3"]
# Kernel tests run on CUDA tensors where a GPU exists, else on CPU tensors under the Triton interpreter.
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Tests that force Triton onto CPU tensors need the interpreter (on a GPU host test_model_gpu covers them).
needs_interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton on CPU tensors needs TRITON_INTERPRET=1"
)


@pytest.fixture(scope="session")
def base_path(tmp_path_factory):
    """base_path(arch, **overrides) -> directory of a tiny random HF model (built once per distinct call)."""
    cache = {}

    def get(arch: str, **overrides):
        key = (arch, tuple(sorted(overrides.items())))
        if key not in cache:
            cache[key] = build_base(tmp_path_factory.mktemp(arch.replace("-", "_")), arch, **overrides)
        return cache[key]

    return get


@pytest.fixture(autouse=True)
def _fresh_context():
    from multilora_cli.layers.context import reset_context

    torch.set_grad_enabled(False)
    yield
    reset_context()
    torch.set_grad_enabled(True)
