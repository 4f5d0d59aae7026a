"""`FusedLinear`: one matmul for several projections stacked along the output (q|k|v, gate|up), in the compute
dtype or in FP8 (e4m3 weights with per-output-channel scales: kernels/fp8.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from multilora_cli.kernels import fp8 as fp8_kernels
from multilora_cli.kernels.fp8 import Fp8Scheme


class FusedLinear(nn.Module):
    """y = x W^T (+ b) with W: [sum(slice_sizes), in] made of `slice_sizes` row blocks.

    Parameters are allocated uninitialised (the loader fills them; tests may initialise them). With `fp8` set,
    `weight` is float8_e4m3fn [out, in] with `weight_scale` fp32 [out] (W ~= weight * weight_scale[:, None]; a
    checkpoint's per-tensor scale is repeated over its slice's rows, so slices with different scales are exact), and
    for static activations `input_scale` fp32 [n_slices] (one per checkpoint projection). `compute_dtype` is the
    dtype of x and y either way (the default dtype at construction).
    """

    def __init__(
        self,
        in_features: int,
        slice_sizes: list[int] | tuple[int, ...],
        bias: bool = False,
        fp8: Fp8Scheme | None = None,
    ):
        super().__init__()
        self.in_features = in_features
        self.slice_sizes = tuple(int(n) for n in slice_sizes)
        self.slice_offsets = tuple(sum(self.slice_sizes[:i]) for i in range(len(self.slice_sizes) + 1))
        self.out_features = self.slice_offsets[-1]
        self.compute_dtype = torch.get_default_dtype()
        self.fp8 = fp8
        wdtype = fp8_kernels.FP8 if fp8 is not None else None
        self.weight = nn.Parameter(torch.empty(self.out_features, in_features, dtype=wdtype), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(self.out_features), requires_grad=False) if bias else None
        if fp8 is not None:
            self.weight_scale = nn.Parameter(torch.ones(self.out_features, dtype=torch.float32), requires_grad=False)
            self.input_scale = (
                nn.Parameter(torch.ones(len(self.slice_sizes), dtype=torch.float32), requires_grad=False)
                if fp8.activations == "static"
                else None
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in] -> [T, out]
        return self.base_forward(x)

    def base_forward(self, x: torch.Tensor) -> torch.Tensor:
        """x W^T (+ b) without any adapter: [T, in] -> [T, out] in x.dtype."""
        if self.fp8 is None:
            return F.linear(x, self.weight, self.bias)
        return fp8_kernels.linear(x, self.weight, self.weight_scale, self.bias, self.fp8, self.input_scale)

    def slice_view(self, param: torch.Tensor, i: int) -> torch.Tensor:
        """Rows of slice i of `param` (weight, bias or weight_scale); input_scale: its element i."""
        if param is getattr(self, "input_scale", None):
            return param.data[i : i + 1]
        lo, hi = self.slice_offsets[i], self.slice_offsets[i + 1]
        return param.data[lo:hi]

    def dequantized_weight(self) -> torch.Tensor:
        """W in fp32 [out, in] (the stored weight itself when not FP8)."""
        if self.fp8 is None:
            return self.weight.data.float()
        return fp8_kernels.dequantize(self.weight.data, self.weight_scale.data)

    def extra_repr(self) -> str:
        fp8 = f", fp8={self.fp8.activations}" if self.fp8 is not None else ""
        return f"in={self.in_features}, slices={self.slice_sizes}, bias={self.bias is not None}{fp8}"
