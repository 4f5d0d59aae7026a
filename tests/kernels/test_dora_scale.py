"""DoRA's per-token scaling: the Triton pass (interpreter on CPU, CUDA on a GPU) and the torch path against a
row-by-row reference: base rows untouched, plain-LoRA slots (ones) untouched, bias kept out of the scaling."""

from __future__ import annotations

import os

import pytest
import torch

from multilora_cli.kernels.dora import apply_dora_reference, apply_dora_torch
from multilora_cli.kernels.dora_scale import BLOCK, dora_scale_triton
from multilora_cli.kernels.meta import build_lora_meta
from multilora_cli.kernels.weights import LoraWeights

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="Triton needs the interpreter or a GPU",
)


def _case(dtype, n=BLOCK + 37, bias=True):
    g = torch.Generator().manual_seed(0)
    w = LoraWeights.empty(3, 4, 8, [n - 20, 20], dtype=dtype, device=DEVICE)
    w.enable_dora()
    w.dora[0] = (torch.rand(n, generator=g) + 0.5).to(DEVICE)  # a DoRA slot
    w.dora[2, :7] = 0.25  # DoRA on a few features only; slot 1 stays a plain LoRA (ones)
    slots = [0, -1, 1, 2, 0, -1, 2]
    y = torch.randn(len(slots), n, generator=g).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=g).to(dtype).to(DEVICE) if bias else None
    return w, slots, y, b


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@needs_triton
def test_triton_pass_matches_reference(dtype, bias):
    w, slots, y, b = _case(dtype, bias=bias)
    want = apply_dora_reference(y, w.dora, slots, b)
    got = y.clone()
    dora_scale_triton(got, w.dora, build_lora_meta(slots, DEVICE).token_slot, b)
    # fp32: exact, but for the fused multiply-add CUDA contracts g*y + (1-g)*b into (one rounding fewer)
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(got, want, **tol)
    for t, s in enumerate(slots):
        if s in (-1, 1):  # base rows and the plain-LoRA slot: bit-identical
            assert torch.equal(got[t], y[t]), t
    assert not torch.equal(got[0], y[0])


@pytest.mark.parametrize("bias", [True, False])
def test_torch_path_matches_reference(bias):
    w, slots, y, b = _case(torch.float32, bias=bias)
    got = y.clone()
    apply_dora_torch(got, w, build_lora_meta(slots, DEVICE), b)
    torch.testing.assert_close(got, apply_dora_reference(y, w.dora, slots, b), atol=1e-6, rtol=1e-6)
    assert torch.equal(got[1], y[1]) and torch.equal(got[2], y[2])
