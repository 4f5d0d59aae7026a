"""LoRA kernels: `add_lora(y, x, weights, meta)` is the one call LoRA layers make.

Dispatch: Triton SGMV kernels (sgmv_shrink.py / sgmv_expand.py) when y is on CUDA, torch ops grouped per
segment (cpu.py) elsewhere. MULTILORA_KERNELS=triton forces the Triton path (tests run it on CPU tensors
under TRITON_INTERPRET=1); MULTILORA_KERNELS=torch forces the torch path.
"""

from __future__ import annotations

import os

import torch

from multilora_cli.kernels.dora import apply_dora
from multilora_cli.kernels.meta import LoraMeta, LoraMetaBuffers, build_lora_meta
from multilora_cli.kernels.weights import LoraWeights

__all__ = [
    "LoraMeta",
    "LoraMetaBuffers",
    "LoraWeights",
    "add_lora",
    "apply_dora",
    "add_lora_silu_mul",
    "build_lora_meta",
    "kernel_path",
    "use_triton",
]


def use_triton(y: torch.Tensor) -> bool:
    """Which path `add_lora` takes for an output tensor y."""
    return kernel_path(y.device) == "triton"


def kernel_path(device: torch.device) -> str:
    """ "triton" | "torch": the path of `add_lora`, the sampler, logprobs and the grammar mask for tensors on
    `device` (the run's stats report it: engine/startup.py). Attention, norms and MoE experts follow the
    device alone (Triton on CUDA)."""
    forced = os.environ.get("MULTILORA_KERNELS", "").lower()
    if forced in ("triton", "torch"):
        return forced
    return "triton" if device.type == "cuda" else "torch"


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


def add_lora_silu_mul(y: torch.Tensor, x: torch.Tensor, w: LoraWeights, meta: LoraMeta) -> torch.Tensor:
    """silu(gate) * up for y = [gate | up] (+ each token's LoRA delta, as `add_lora` adds it): [T, I].

    On the Triton path with a fusable pool (two equal slices, ranks <= 64) one kernel adds the delta and applies
    the activation, reading y once and leaving it unchanged (sgmv_silu.py). Otherwise `add_lora` updates y in
    place and the activation follows. Same values either way (the fused kernel rounds as the two steps do).
    """
    if use_triton(y):
        from multilora_cli.kernels.sgmv import add_lora_silu_mul_triton
        from multilora_cli.kernels.sgmv_silu import fusable

        if fusable(w):  # DoRA rows (w.dora) are scaled inside, before the activation
            return add_lora_silu_mul_triton(y, x, w, meta)
    add_lora(y, x, w, meta)
    if w.dora is not None:
        apply_dora(y, w, meta)
    if y.is_cuda:
        from multilora_cli.kernels import norm_rope

        return norm_rope.silu_mul(y)
    gate, up = y.split(w.out_features // 2, dim=-1)
    return torch.nn.functional.silu(gate) * up
