"""Triton path of `add_lora`: shrink into an fp32 partial-sum buffer, then expand into y (two launches)."""

from __future__ import annotations

import torch

from multilora_cli.kernels.blocks import ExpandBlocks, ShrinkBlocks, SiluBlocks
from multilora_cli.kernels.checks import capturing
from multilora_cli.kernels.meta import LoraMeta
from multilora_cli.kernels.sgmv_expand import default_expand_blocks, lora_expand
from multilora_cli.kernels.sgmv_shrink import default_shrink_blocks, lora_shrink
from multilora_cli.kernels.sgmv_silu import lora_expand_silu_mul
from multilora_cli.kernels.weights import LoraWeights

__all__ = ["add_lora_silu_mul_triton", "add_lora_triton", "lora_expand", "lora_shrink"]


def add_lora_triton(
    y: torch.Tensor,
    x: torch.Tensor,
    w: LoraWeights,
    meta: LoraMeta,
    shrink: ShrinkBlocks | None = None,
    expand: ExpandBlocks | None = None,
) -> None:
    """y[t, off_i:off_i+n_i] += scale * (x[t] @ a[slot, i, :r].T) @ b[slot, off_i:off_i+n_i, :r].T, in place.

    No host sync: block sizes depend on static shapes only, the grid on host-known tile counts (or on a
    static bound while a CUDA graph is being captured). The fp32 intermediate [split, T, n_slices, R] comes
    from the caching allocator (inside a graph: the graph's private pool), so nothing is zero-filled.
    """
    if not meta.segments and not capturing(y.device):
        return  # no adapted token in this step; under capture a later replay may have some
    sb = shrink or default_shrink_blocks(x, w)
    eb = expand or default_expand_blocks(y, w)
    s = torch.empty((sb.split, x.shape[0], w.n_slices, w.max_rank), dtype=torch.float32, device=x.device)
    lora_shrink(x, w, meta, s, sb)
    lora_expand(s, w, meta, y, eb, after_shrink=True)


def add_lora_silu_mul_triton(
    y: torch.Tensor,
    x: torch.Tensor,
    w: LoraWeights,
    meta: LoraMeta,
    shrink: ShrinkBlocks | None = None,
    silu: SiluBlocks | None = None,
) -> torch.Tensor:
    """silu(gate) * up of y = [gate | up] with each token's LoRA delta added first: [T, I], two launches (the
    shrink, then the expand fused with the activation: sgmv_silu.py). y is only read. `fusable(w)` must hold."""
    sb = shrink or default_shrink_blocks(x, w)
    s = torch.empty((sb.split, x.shape[0], w.n_slices, w.max_rank), dtype=torch.float32, device=x.device)
    out = torch.empty((y.shape[0], w.out_features // 2), dtype=y.dtype, device=y.device)
    shrunk = bool(meta.segments) or capturing(y.device)  # an eager step of base rows only needs no shrink
    if shrunk:
        lora_shrink(x, w, meta, s, sb)
    lora_expand_silu_mul(s, w, meta, y, out, silu, after_shrink=shrunk)
    return out
