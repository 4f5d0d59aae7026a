"""Fixtures for model tests: tiny HF checkpoints built once per session, HF reference models, paged batches."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported: Triton runs on CPU

import pytest
import torch

from tests.builders import build_base

ARCHS = ["llama", "llama-tied", "llama3", "mistral", "qwen2", "qwen3"]


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
