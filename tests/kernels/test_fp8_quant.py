"""The one-launch FP8 activation quantization (kernels/fp8_quant.py) equals the torch formula of
kernels/fp8.quantize_activations bit for bit: e4m3 values and fp32 scales, dynamic (with and without fbgemm's
upper bound) and static, on CUDA or under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels import fp8, fp8_quant
from tests.devices import KERNEL_DEVICE, needs_interpreter

DEV = KERNEL_DEVICE
pytestmark = needs_interpreter if DEV == "cpu" else []


def test_constants_match():
    assert fp8_quant.MIN_SCALE == fp8.MIN_SCALE and fp8_quant.FP8_MAX == fp8.FP8_MAX


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16] + ([torch.bfloat16] if DEV == "cuda" else []))
@pytest.mark.parametrize("activations,scale_ub", [("dynamic", None), ("dynamic", 0.75), ("static", None)])
@pytest.mark.parametrize("K", [7, 256, 1500])
def test_kernel_equals_the_torch_formula(dtype, activations, scale_ub, K):
    g = torch.Generator().manual_seed(K)
    x = (torch.randn(5, K, generator=g) * torch.tensor([1e-3, 0.1, 1.0, 30.0, 0.0])[:, None]).to(dtype).to(DEV)
    scheme = fp8.Fp8Scheme(activations=activations, scale_ub=scale_ub)
    input_scale = torch.tensor([0.01, 0.03], device=DEV)  # a fused layer's slices: the largest is used
    want_q, want_s = fp8.quantize_activations(x, scheme, input_scale)
    got_q, got_s = fp8.quantize_activations_cuda(x, scheme, input_scale)
    assert got_q.dtype == torch.float8_e4m3fn and got_s.shape == (5, 1)
    assert torch.equal(got_s, want_s.expand(5, 1).float())
    if DEV == "cpu":
        # the interpreter's e4m3 cast is an emulation that can be far off (126.4 -> 64): check the kernel's
        # arithmetic on its fp32 quotients, and that torch's cast of them is the reference
        static = input_scale.amax().clamp(min=fp8.MIN_SCALE).reshape(1) if activations == "static" else None
        ub = scale_ub if activations == "dynamic" else None
        quot, s = fp8_quant.quantize_rows_fp8(x, static, ub, out_dtype=torch.float32)
        assert torch.equal(s, got_s)
        assert torch.equal(quot, (x.float() / s).clamp(-fp8.FP8_MAX, fp8.FP8_MAX))
        assert torch.equal(quot.to(torch.float8_e4m3fn).view(torch.uint8), want_q.view(torch.uint8))
    else:
        assert torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))


def test_weight_only_passes_activations_through():
    x = torch.randn(3, 16, device=DEV)
    xq, s = fp8.quantize_activations_cuda(x, fp8.Fp8Scheme(activations="none"), None)
    assert xq is x and s is None
