"""`FusedLinear`: one matmul for several projections stacked along the output (q|k|v, gate|up)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FusedLinear(nn.Module):
    """y = x W^T (+ b) with W: [sum(slice_sizes), in] made of `slice_sizes` row blocks.

    Parameters are allocated uninitialised (the loader fills them; tests may initialise them).
    `load_slice(i, weight, bias)` copies a checkpoint tensor into slice i.
    """

    def __init__(self, in_features: int, slice_sizes: list[int] | tuple[int, ...], bias: bool = False):
        super().__init__()
        self.in_features = in_features
        self.slice_sizes = tuple(int(n) for n in slice_sizes)
        self.slice_offsets = tuple(sum(self.slice_sizes[:i]) for i in range(len(self.slice_sizes) + 1))
        self.out_features = self.slice_offsets[-1]
        self.weight = nn.Parameter(torch.empty(self.out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(self.out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in] -> [T, out]
        return F.linear(x, self.weight, self.bias)

    def slice_view(self, param: torch.Tensor, i: int) -> torch.Tensor:
        """Rows of slice i of `param` (weight or bias)."""
        lo, hi = self.slice_offsets[i], self.slice_offsets[i + 1]
        return param.data[lo:hi]

    def extra_repr(self) -> str:
        return f"in={self.in_features}, slices={self.slice_sizes}, bias={self.bias is not None}"
