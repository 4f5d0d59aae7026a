"""kernels/fp8_mm.weight_dequant_mm (Triton) against its torch reference, and kernels/fp8.py's semantics.

On a CPU host the kernel runs under TRITON_INTERPRET=1, which loads float8_e4m3fn and upcasts it (checked below);
its tl.dot runs in fp32 there (the interpreter's bf16 dot is garbage), fp32 / fp16 activations. On a GPU the
gpu-marked tests run bf16 through both the Triton kernel and cuBLAS _scaled_mm, and a CUDA graph of the layer."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels import fp8
from multilora_cli.kernels.fp8 import Fp8Scheme
from tests.devices import KERNEL_DEVICE, needs_interpreter

SHAPES = [(1, 64, 48), (5, 200, 72), (16, 128, 256), (33, 96, 40)]  # (M, K, N): ragged K and N, M past a block


def _case(m, k, n, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype).to(device)
    wq, ws = fp8.quantize_rows(torch.randn(n, k, generator=g) * 0.05)
    bias = torch.randn(n, generator=g).to(dtype).to(device)
    return x, wq.to(device), ws.to(device), bias


@needs_interpreter
@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("acts", ["dynamic", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_matches_reference_interpreted(m, k, n, acts, dtype):
    from multilora_cli.kernels.fp8_mm import weight_dequant_mm, weight_dequant_mm_reference

    x, wq, ws, bias = _case(m, k, n, dtype, "cpu")
    a, a_scale = fp8.quantize_activations(x, Fp8Scheme(acts), None)
    got = weight_dequant_mm(a, wq, ws, a_scale, bias, out_dtype=dtype)
    want = weight_dequant_mm_reference(a, wq, ws, a_scale, bias, out_dtype=dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    # and the layer's formula: quantize, multiply, scale (kernels/fp8.linear_reference)
    ref = fp8.linear_reference(x, wq, ws, bias, Fp8Scheme(acts))
    torch.testing.assert_close(got, ref, atol=tol, rtol=tol)


@needs_interpreter
@pytest.mark.parametrize("m,k,n,config", [(3, 1000, 40, (32, 128, 4, 4, 1)), (17, 700, 96, (64, 256, 2, 4, 1))])
@pytest.mark.parametrize("acts", ["dynamic", "none"])
def test_split_k_matches_reference_interpreted(m, k, n, config, acts):
    """Split-K (fp32 partials summed in split order by the reduce launch), ragged K inside the last split."""
    from multilora_cli.kernels.fp8_mm import weight_dequant_mm, weight_dequant_mm_reference

    x, wq, ws, bias = _case(m, k, n, torch.float32, "cpu")
    a, a_scale = fp8.quantize_activations(x, Fp8Scheme(acts), None)
    got = weight_dequant_mm(a, wq, ws, a_scale, bias, out_dtype=torch.float32, config=config)
    want = weight_dequant_mm_reference(a, wq, ws, a_scale, bias, out_dtype=torch.float32)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def test_pick_config_splits_small_grids_only():
    from multilora_cli.kernels.fp8_mm import pick_config

    _, bk, split, _, _ = pick_config(1, 4096, 14336)  # Llama-3-8B down_proj at batch 1: 64 tiles, K split
    assert split > 1 and 14336 // bk >= 2 * split
    assert pick_config(16, 128, 256)[2] == 1  # K of two blocks: nothing to split
    assert pick_config(32, 28672, 4096) == pick_config(32, 28672, 4096)  # a function of the shape alone


def test_quantization_rounds_to_e4m3():
    x = torch.tensor([[0.0, 1.0, -448.0 / 2, 3.3], [0.0, 0.0, 0.0, 0.0], [1e-3, -2e-3, 5e-4, 0.0]])
    xq, s = fp8.quantize_activations(x, Fp8Scheme("dynamic"), None)
    assert xq.dtype == torch.float8_e4m3fn and s.shape == (3, 1)
    torch.testing.assert_close(s[:, 0], torch.tensor([224.0 / 448, fp8.MIN_SCALE, 2e-3 / 448]))
    assert torch.equal(xq[1].float(), torch.zeros(4))  # an all-zero token stays zero (never nan)
    assert xq[0, 2].float() == -448 and xq[2, 1].float() == -448  # each row's absmax lands on the top of e4m3
    # the fbgemm bound clamps the absmax: a token beyond it saturates instead of stretching the scale
    xq, s = fp8.quantize_activations(x, Fp8Scheme("dynamic", scale_ub=100.0), None)
    assert s[0, 0] == torch.tensor(100.0) * (1 / 448) and xq[0, 2].float() == -448
    xq, s = fp8.quantize_activations(x, Fp8Scheme("static"), torch.tensor([0.5, 2.0]))
    assert torch.equal(s, torch.full((3, 1), 2.0))  # the largest of a fused layer's input scales


def test_quantize_rows_is_per_channel():
    w = torch.tensor([[1.0, -2.0, 0.5], [100.0, 3.0, -7.0]])
    wq, s = fp8.quantize_rows(w)
    torch.testing.assert_close(s, torch.tensor([2.0 / 448, 100.0 / 448]))
    assert torch.equal(wq[:, :2].float().abs().amax(dim=1), torch.tensor([448.0, 448.0]))
    assert ((fp8.dequantize(wq, s) - w).abs() <= w.abs() * 2**-4 + s[:, None] * 2**-9).all()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 16, 31, 32, 64, 257])
@pytest.mark.parametrize("acts", ["dynamic", "static", "none"])
def test_gpu_paths_match_the_reference(m, acts):
    """bf16 on CUDA: whichever path M picks (Triton below small_m, _scaled_mm from it) == the fp32 reference."""
    x, wq, ws, bias = _case(m, 4096, 1024, torch.bfloat16, KERNEL_DEVICE)
    scheme = Fp8Scheme(acts, small_m=32)
    s_in = torch.tensor([x.abs().max().item() / 448], device=x.device) if acts == "static" else None
    got = fp8.linear(x, wq, ws, bias, scheme, s_in).float()
    want = fp8.linear_reference(x, wq, ws, bias, scheme, s_in).float()
    # bf16 output rounding (2^-8 relative) plus a different fp32 summation order
    torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-2)


@pytest.mark.gpu
def test_gpu_layer_captures_in_a_cuda_graph():
    x, wq, ws, bias = _case(8, 512, 256, torch.bfloat16, KERNEL_DEVICE)
    for scheme in (Fp8Scheme("dynamic", small_m=4), Fp8Scheme("dynamic", small_m=64)):  # cuBLAS, then Triton
        eager = fp8.linear(x, wq, ws, bias, scheme)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fp8.linear(x, wq, ws, bias, scheme)
        graph.replay()
        torch.testing.assert_close(out, eager)
