"""Triton path of `add_lora`: shrink into an fp32 partial-sum buffer, then expand into y: one launch
(sgmv_fused.py) where the shape table says so, two launches (sgmv_shrink.py, sgmv_expand.py) otherwise."""

from __future__ import annotations

import os

import torch

from multilora_cli.kernels.blocks import ExpandBlocks, ShrinkBlocks, use_fused
from multilora_cli.kernels.checks import capturing
from multilora_cli.kernels.meta import LoraMeta
from multilora_cli.kernels.sgmv_expand import default_expand_blocks, lora_expand
from multilora_cli.kernels.sgmv_fused import fused_supported, lora_fused
from multilora_cli.kernels.sgmv_shrink import default_shrink_blocks, lora_shrink
from multilora_cli.kernels.weights import LoraWeights

__all__ = ["add_lora_triton", "lora_expand", "lora_shrink"]


def _fused_wanted(t: int, w: LoraWeights, meta: LoraMeta, sb: ShrinkBlocks, eb: ExpandBlocks) -> bool:
    if not fused_supported(w, meta) or sb.bm != eb.bm:
        return False
    forced = os.environ.get("MULTILORA_SGMV_FUSED", "")  # "1" / "0": A/B runs and tests
    if forced in ("0", "1"):
        return forced == "1"
    return use_fused(t, w.in_features, w.out_features)


def add_lora_triton(y: torch.Tensor, x: torch.Tensor, w: LoraWeights, meta: LoraMeta,
                    shrink: ShrinkBlocks | None = None, expand: ExpandBlocks | None = None,
                    fused: bool | None = None) -> None:
    """y[t, off_i:off_i+n_i] += scale * (x[t] @ a[slot, i, :r].T) @ b[slot, off_i:off_i+n_i, :r].T, in place.

    fused: one launch (True), two (False), or the shape table's choice (None).
    No host sync: block sizes depend on static shapes only, the grid on host-known tile counts (or on a
    static bound while a CUDA graph is being captured). The fp32 intermediate [split, T, n_slices, R] comes
    from the caching allocator (inside a graph: the graph's private pool), so nothing is zero-filled.
    """
    if not meta.segments and not capturing(y.device):
        return  # no adapted token in this step; under capture a later replay may have some
    sb = shrink or default_shrink_blocks(x, w)
    eb = expand or default_expand_blocks(y, w)
    if fused if fused is not None else _fused_wanted(x.shape[0], w, meta, sb, eb):
        lora_fused(y, x, w, meta, sb, eb)
        return
    s = torch.empty((sb.split, x.shape[0], w.n_slices, w.max_rank), dtype=torch.float32, device=x.device)
    lora_shrink(x, w, meta, s, sb)
    lora_expand(s, w, meta, y, eb)
