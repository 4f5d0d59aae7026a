"""FP8 (e4m3) linear layers: weight quantization, activation quantization, and the GEMM chosen per token count.

Semantics (every path, every device), for x: [M, K] (bf16 / fp16 / fp32), wq: [N, K] float8_e4m3fn,
w_scale: [N] float32 (per output channel; a per-tensor scale is repeated over its rows), bias: [N] or None:

    xq, x_scale = quantize(x)          # Fp8Scheme.activations:
                                       #   "dynamic": per token s = min(absmax(x[m]), scale_ub) * fp32(1/448)
                                       #              (fp32, floored at MIN_SCALE > 0; a multiply by the
                                       #              reciprocal, as torch's CUDA division by a scalar is, so
                                       #              every device and kernel computes the same bits),
                                       #              xq[m] = e4m3(clamp(x[m] / s, -448, 448))   (round to nearest)
                                       #   "static":  s = input_scale (one fp32 for all tokens), xq as above
                                       #   "none":    xq = x, s = 1 (weight-only, W8A16)
    y[m, n] = (sum_k xq[m, k] * wq[n, k]) * x_scale[m] * w_scale[n] (+ bias[n])   # fp32 accumulate
    return y.to(x.dtype)                                                           # [M, N]

Quantizing a token depends on that token alone, so a row's result never depends on the other rows of the batch.
Implementations: `linear_reference` (torch, fp32 math: the CPU path and the tests' reference); on CUDA
`torch._scaled_mm` with row-wise scales for M >= Fp8Scheme.small_m (cuBLAS FP8 tensor cores win from there), else
`fp8_mm.weight_dequant_mm` (Triton, split-K: e4m3 x e4m3 on the FP8 tensor cores on sm_89+, else both operands upcast in registers to bf16; e4m3 values are exact in
bf16, so the products are the same numbers). A "none" scheme always takes the Triton kernel (its x is not fp8).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multilora_cli.config import FP8_SMALL_M

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # floor of a scale: an all-zero row quantizes to zeros, never to nan
ACTIVATIONS = ("dynamic", "static", "none")
DEFAULT_SMALL_M = FP8_SMALL_M  # below this many tokens the Triton kernel, from it cuBLAS (measured: config.py)


@dataclass(frozen=True, slots=True)
class Fp8Scheme:
    """How one FP8 linear layer runs: activation quantization (see the module docstring), fbgemm's per-token
    absmax upper bound (None: unbounded), and the token count from which cuBLAS _scaled_mm takes over."""

    activations: str = "dynamic"
    scale_ub: float | None = None
    small_m: int = DEFAULT_SMALL_M

    def __post_init__(self) -> None:
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {ACTIVATIONS}, got {self.activations!r}")
        if self.scale_ub is not None and not self.scale_ub > 0:
            raise ValueError(f"scale_ub must be > 0, got {self.scale_ub}")
        if isinstance(self.small_m, bool) or not isinstance(self.small_m, int) or self.small_m < 0:
            raise ValueError(f"small_m must be an integer >= 0, got {self.small_m!r}")


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel quantization of w: [N, K] -> (wq [N, K] e4m3, scale [N] fp32), w ~= wq * scale[:, None]."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=MIN_SCALE)  # [N]
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def dequantize(wq: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """wq: [N, K] e4m3, scale: [N] -> fp32 [N, K]."""
    return wq.float() * scale.float()[:, None]


def quantize_activations(
    x: torch.Tensor, scheme: Fp8Scheme, input_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x: [M, K] -> (xq [M, K] e4m3, x_scale [M, 1] fp32); ("none": (x, None)). input_scale: [S] fp32 for
    "static" (a fused layer's slices may carry their own: the largest is used, so none of them clips)."""
    if scheme.activations == "none":
        return x, None
    xf = x.float()
    if scheme.activations == "static":
        s = input_scale.float().amax().clamp(min=MIN_SCALE).expand(x.shape[0], 1)  # [M, 1]
    else:
        amax = xf.abs().amax(dim=1, keepdim=True)  # [M, 1]
        if scheme.scale_ub is not None:
            amax = amax.clamp(max=scheme.scale_ub)
        s = (amax * (1.0 / FP8_MAX)).clamp(min=MIN_SCALE)  # the fp32 reciprocal (module docstring)
    return (xf / s).clamp(-FP8_MAX, FP8_MAX).to(FP8), s.contiguous()


def quantize_activations_cuda(
    x: torch.Tensor, scheme: Fp8Scheme, input_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`quantize_activations` in one Triton launch (kernels/fp8_quant.py: the same numbers, 1 read of x instead of
    ~6 passes over fp32 copies)."""
    if scheme.activations == "none":
        return x, None
    from multilora_cli.kernels.fp8_quant import quantize_rows_fp8  # triton: imported on the CUDA path only

    static = None
    if scheme.activations == "static":
        static = input_scale.float().amax().clamp(min=MIN_SCALE).reshape(1)
    return quantize_rows_fp8(x, static, scheme.scale_ub if scheme.activations == "dynamic" else None)


def linear_reference(
    x: torch.Tensor,
    wq: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    scheme: Fp8Scheme,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The module docstring's formula in torch, fp32 math rounded once to x.dtype: [M, N]."""
    xq, x_scale = quantize_activations(x, scheme, input_scale)
    xd = xq.float() if x_scale is None else xq.float() * x_scale
    y = torch.nn.functional.linear(xd, dequantize(wq, w_scale), None if bias is None else bias.float())
    return y.to(x.dtype)


def linear(
    x: torch.Tensor,
    wq: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    scheme: Fp8Scheme,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 linear (module docstring) on x's device: x [M, K] -> [M, N] in x.dtype. The path is picked from M alone,
    so a CUDA graph captured for a batch size replays the same kernels."""
    if not x.is_cuda:
        return linear_reference(x, wq, w_scale, bias, scheme, input_scale)
    xq, x_scale = quantize_activations_cuda(x, scheme, input_scale)
    if x_scale is not None and x.shape[0] >= scheme.small_m and _cublas_shapes(x, wq):
        # row-wise scales: a [M, 1] and b [1, N], both fp32; wq.t() is the column-major operand cuBLAS wants
        y = torch._scaled_mm(xq, wq.t(), scale_a=x_scale, scale_b=w_scale.view(1, -1), out_dtype=x.dtype)
        return y if bias is None else y + bias
    from multilora_cli.kernels.fp8_mm import weight_dequant_mm  # triton: imported on the CUDA path only

    return weight_dequant_mm(xq, wq, w_scale, x_scale, bias, out_dtype=x.dtype)


def _cublas_shapes(x: torch.Tensor, wq: torch.Tensor) -> bool:
    """Row-wise _scaled_mm wants a bf16 output and K, N multiples of 16 (else the Triton kernel serves)."""
    return x.dtype == torch.bfloat16 and x.shape[1] % 16 == 0 and wq.shape[0] % 16 == 0
