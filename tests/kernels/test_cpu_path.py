"""CPU path of add_lora (torch grouped per segment) against the float64 reference."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels import add_lora, build_lora_meta, use_triton
from multilora_cli.kernels.reference import add_lora_reference
from tests.kernels.lora_cases import POPULARITY, assert_matches, make_pool, token_slots


def _run(in_f, slices, dtype, ts, tol, seed=0):
    w = make_pool(in_f, slices, dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(len(ts), in_f, generator=g).to(dtype)
    y = torch.randn(len(ts), sum(slices), generator=g).to(dtype)
    y0 = y.clone()
    add_lora(y, x, w, build_lora_meta(ts))
    assert_matches(y, y0, add_lora_reference(y0, x, w, torch.tensor(ts)), ts, w, tol)


@pytest.fixture(autouse=True)
def _default_dispatch(monkeypatch):
    monkeypatch.delenv("MULTILORA_KERNELS", raising=False)


@pytest.mark.parametrize("t", [1, 7, 133])
@pytest.mark.parametrize("pattern", POPULARITY)
def test_cpu_path_fp32(pattern, t):
    assert not use_triton(torch.zeros(1))
    _run(128, [256, 64, 64], torch.float32, token_slots(pattern, t, seed=t), 1e-5)


@pytest.mark.parametrize("pattern", ["zipf", "distinct"])
def test_cpu_path_bf16(pattern):
    _run(96, [160, 32, 32], torch.bfloat16, token_slots(pattern, 50, seed=4), 3e-2)


def test_cpu_path_llama3_qkv_widths():
    """Real GQA widths of Llama-3-8B's fused qkv (4096 -> 4096/1024/1024)."""
    _run(4096, [4096, 1024, 1024], torch.float32, token_slots("zipf", 7, seed=9), 1e-5)


def test_forced_torch_path(monkeypatch):
    monkeypatch.setenv("MULTILORA_KERNELS", "torch")
    assert not use_triton(torch.zeros(1))
    _run(64, [64], torch.float32, token_slots("uniform", 11, seed=2), 1e-5)
