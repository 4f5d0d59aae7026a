"""One-launch RMSNorm / rotary / SiLU-and-mul kernels equal the torch code they replace on CUDA.

CPU: the Triton kernels under the interpreter (fp32, fp16) against the torch path on the same inputs: exact.
CUDA (device tool): bf16 and fp32 on the GPU against the torch path computed on CPU: the GPU compiler may fuse
a multiply-add, so a few elements may differ by one unit in the last place (seen on an H200 for rotary).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernel module is imported: Triton runs in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from multilora_cli.kernels.norm_rope import add_rms_norm, rms_norm, rotary, silu_mul  # noqa: E402
from multilora_cli.layers.norm import RMSNorm  # noqa: E402
from multilora_cli.layers.rotary import RotaryEmbedding, apply_rotary  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if DEV == "cuda" else [torch.float32, torch.float16]


def _torch_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    norm = RMSNorm(x.shape[-1], eps)
    norm.weight.data = w.detach().cpu().clone()
    return norm(x.detach().cpu())  # CPU tensors take the torch path


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 64), (3, 4, 32)])
def test_rms_norm_matches_torch(dtype, shape):
    g = torch.Generator().manual_seed(1)
    big = torch.randn(shape[0], 3 * shape[-1] * (shape[1] if len(shape) == 3 else 1), generator=g) * 3
    x = big[:, : torch.Size(shape[1:]).numel()].view(shape)  # a strided view, like q/k of a fused qkv output
    w = 1 + 0.1 * torch.randn(shape[-1], generator=g)
    want = _torch_norm(x.to(dtype), w.to(dtype), 1e-5)
    got = rms_norm(x.to(dtype).to(DEV), w.to(dtype).to(DEV), 1e-5).cpu()
    assert got.dtype == dtype and got.shape == want.shape
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # sum order in the mean; half rounding then flips an ulp
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    if dtype != torch.float32:  # nearly every element identical
        assert (got == want).float().mean() > 0.98


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_matches_add_then_norm(dtype):
    """The residual add fused into the norm: the sum exactly torch's (x + r), the norm as rms_norm's of it."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(6, 3 * 96, generator=g) * 4)[:, 96:192]  # a strided view
    r = torch.randn(6, 96, generator=g) * 4
    w = 1 + 0.1 * torch.randn(96, generator=g)
    xd, rd, wd = (v.to(dtype).to(DEV) for v in (x, r, w))
    normed, summed = add_rms_norm(xd, rd, wd, 1e-5)
    want_sum = x.to(dtype) + r.to(dtype)
    assert summed.dtype == dtype and torch.equal(summed.cpu(), (xd + rd).cpu())
    torch.testing.assert_close(summed.cpu().float(), want_sum.float(), rtol=0, atol=0)
    assert torch.equal(normed, rms_norm(summed, wd, 1e-5))  # one rounding rule (_norm_store) for both kernels
    module = RMSNorm(96, 1e-5)
    module.weight.data = w.to(dtype)
    cpu_normed, cpu_sum = module.forward_add(x.to(dtype), r.to(dtype))  # the torch path of the layer
    assert torch.equal(cpu_sum, want_sum)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(normed.cpu().float(), cpu_normed.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_matches_torch(dtype):
    g = torch.Generator().manual_seed(2)
    T, H, D = 7, 6, 32
    rope = RotaryEmbedding(D, 10000.0)
    pos = torch.tensor([0, 1, 5, 17, 100, 511, 3])
    cos, sin = rope(pos)
    qkv = torch.randn(T, (H + 4) * D, generator=g) * 2
    x = qkv[:, : H * D].view(T, H, D)  # strided view
    want = apply_rotary(x.to(dtype), cos, sin)
    got = rotary(x.to(dtype).to(DEV), cos.to(DEV), sin.to(DEV)).cpu()
    assert got.dtype == dtype
    _same_up_to_an_ulp(got, want, x.abs().amax(-1, keepdim=True).to(dtype).expand_as(want))


def _same_up_to_an_ulp(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor, exact_on_cpu: bool = True) -> None:
    """Exact under the interpreter; on a GPU within 2 ulp of `scale` (the magnitude of the products summed, since
    a fused multiply-add skips one rounding: seen on an H200 for rotary) and mostly identical."""
    if DEV == "cpu" and exact_on_cpu:
        assert torch.equal(got, want)
        return
    eps = torch.finfo(want.dtype).eps
    assert ((got.float() - want.float()).abs() <= 2 * eps * scale.float()).all()
    if want.dtype != torch.float32:  # 16-bit: most fp32 differences vanish in the final rounding
        assert (got == want).float().mean() > 0.8  # rotary bf16 on an H200: 0.87 identical, the rest 1 ulp


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_torch(dtype):
    g = torch.Generator().manual_seed(3)
    T, I = 5, 1500  # I not a multiple of the block
    gate_up = (torch.randn(T, 2 * I, generator=g) * 3).to(dtype)
    gate, up = gate_up.split(I, dim=-1)
    want = torch.nn.functional.silu(gate) * up
    got = silu_mul(gate_up.to(DEV)).cpu()
    assert got.shape == (T, I) and got.dtype == dtype
    # torch's CPU silu rounds its exp differently: not exact even under the interpreter
    _same_up_to_an_ulp(got, want, want.abs() + want.abs().max() * 1e-2, exact_on_cpu=False)
