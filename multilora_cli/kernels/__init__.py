"""LoRA kernels: `add_lora(y, x, weights, meta)` is the one call LoRA layers make.

Dispatch: Triton SGMV kernels on CUDA, torch ops grouped per segment elsewhere.
"""

from __future__ import annotations

import torch

from multilora_cli.kernels.meta import LoraMeta, build_lora_meta
from multilora_cli.kernels.weights import LoraWeights

__all__ = ["LoraMeta", "LoraWeights", "add_lora", "build_lora_meta"]


def add_lora(y: torch.Tensor, x: torch.Tensor, w: LoraWeights, meta: LoraMeta) -> None:
    """y[t, off_i:off_i+n_i] += scale[s,i] * (x[t] @ a[s,i,:r].T) @ b[s, off_i:off_i+n_i, :r].T for s = slot(t) >= 0.

    y: [T, out_features] (updated in place), x: [T, in_features]; see `LoraWeights` and `LoraMeta`.
    """
    if not meta.segments:
        return
    from multilora_cli.kernels.cpu import add_lora_torch

    add_lora_torch(y, x, w, meta)
