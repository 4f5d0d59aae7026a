"""CPU path of `add_lora`: torch ops grouped per segment (one gather + two matmuls per adapter)."""

from __future__ import annotations

import torch

from multilora_cli.kernels.meta import LoraMeta
from multilora_cli.kernels.weights import LoraWeights


def add_lora_torch(y: torch.Tensor, x: torch.Tensor, w: LoraWeights, meta: LoraMeta) -> None:
    """y[t] += LoRA delta of token t's slot, in place. y: [T, out], x: [T, in]. Same semantics as the kernels."""
    ranks = w.rank.tolist() if w.rank.device.type == "cpu" else w.rank.cpu().tolist()
    scales = w.scale.tolist() if w.scale.device.type == "cpu" else w.scale.cpu().tolist()
    for slot, start, end in meta.segments:
        idx = meta.sorted_idx[start:end].long()
        xs = x.index_select(0, idx)  # [n, in]
        for i in range(w.n_slices):
            r = ranks[slot][i]
            if r == 0:
                continue
            lo, hi = w.slice_offsets[i], w.slice_offsets[i + 1]
            s = (xs @ w.a[slot, i, :r].T).float() * scales[slot][i]  # [n, r] fp32
            delta = s.to(x.dtype) @ w.b[slot, lo:hi, :r].T  # [n, hi-lo]
            y[idx, lo:hi] += delta.to(y.dtype)
