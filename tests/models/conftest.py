"""Fixtures for model tests: tiny HF checkpoints built once per session, a fresh step context per test."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # before any kernel module is imported: Triton kernels then run on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.builders import build_base


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
