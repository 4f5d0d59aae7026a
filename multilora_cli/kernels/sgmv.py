"""Triton path of `add_lora`: shrink into an fp32 partial-sum buffer, then expand into y (two launches)."""

from __future__ import annotations

import torch

from multilora_cli.kernels.blocks import ExpandBlocks, ShrinkBlocks
from multilora_cli.kernels.checks import capturing
from multilora_cli.kernels.meta import LoraMeta
from multilora_cli.kernels.sgmv_expand import default_expand_blocks, lora_expand
from multilora_cli.kernels.sgmv_shrink import default_shrink_blocks, lora_shrink
from multilora_cli.kernels.weights import LoraWeights

__all__ = ["add_lora_triton", "lora_expand", "lora_shrink"]


def add_lora_triton(y: torch.Tensor, x: torch.Tensor, w: LoraWeights, meta: LoraMeta,
                    shrink: ShrinkBlocks | None = None, expand: ExpandBlocks | None = None) -> None:
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
