"""LoRA kernels: `add_lora(y, x, weights, meta)` is the one call LoRA layers make.

Dispatch: Triton SGMV kernels (sgmv_shrink.py / sgmv_expand.py) when y is on CUDA, torch ops grouped per
segment (cpu.py) elsewhere. MULTILORA_KERNELS=triton forces the Triton path (tests run it on CPU tensors
under TRITON_INTERPRET=1); MULTILORA_KERNELS=torch forces the torch path.
"""

from __future__ import annotations

import os

import torch

from multilora_cli.kernels.meta import LoraMeta, LoraMetaBuffers, build_lora_meta
from multilora_cli.kernels.weights import LoraWeights

__all__ = ["LoraMeta", "LoraMetaBuffers", "LoraWeights", "add_lora", "build_lora_meta", "use_triton"]


def use_triton(y: torch.Tensor) -> bool:
    """Which path `add_lora` takes for an output tensor y."""
    forced = os.environ.get("MULTILORA_KERNELS", "").lower()
    if forced == "triton":
        return True
    if forced == "torch":
        return False
    return y.is_cuda


def add_lora(y: torch.Tensor, x: torch.Tensor, w: LoraWeights, meta: LoraMeta) -> None:
    """y[t, off_i:off_i+n_i] += scale[s,i] * (x[t] @ a[s,i,:r].T) @ b[s, off_i:off_i+n_i, :r].T for s = slot(t) >= 0.

    y: [T, out_features] (updated in place), x: [T, in_features]; see `LoraWeights` and `LoraMeta`.
    On CUDA: two Triton launches, no host sync, CUDA-graph capturable with `LoraMetaBuffers` metadata.
    """
    if use_triton(y):
        from multilora_cli.kernels.sgmv import add_lora_triton

        add_lora_triton(y, x, w, meta)
        return
    if not meta.segments:
        return
    from multilora_cli.kernels.cpu import add_lora_torch

    add_lora_torch(y, x, w, meta)
