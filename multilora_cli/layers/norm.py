"""RMSNorm, computed like Hugging Face's LlamaRMSNorm (float32 statistics, weight applied in model dtype)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """y = weight * x / sqrt(mean(x^2) + eps) over the last dim. Used on hidden states and (Qwen3) per head."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., dim]
        if x.is_cuda and x.dim() in (2, 3):  # one launch instead of ~7 (kernels/norm_rope.py)
            from multilora_cli.kernels import norm_rope

            if norm_rope.enabled(x):
                return norm_rope.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(x + residual), x + residual): a decoder layer's residual add and the norm after it; one launch
        on CUDA, the same bits as the two ops."""
        if x.is_cuda and x.dim() == 2:
            from multilora_cli.kernels import norm_rope

            if norm_rope.enabled(x):
                return norm_rope.add_rms_norm(x, residual, self.weight, self.eps)
        summed = x + residual
        return self(summed), summed


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: y = (x / sqrt(mean(x^2) + eps)) * (1 + weight), all in float32, cast once at the end
    (transformers' Gemma2RMSNorm / Gemma3RMSNorm; Llama's casts before the weight). Checkpoints store the offset
    weight (zero = identity). Torch ops on every device: the fused CUDA kernels round the Llama way."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__(dim, eps)
        with torch.no_grad():
            self.weight.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(x + residual), x + residual)."""
        summed = x + residual
        return self(summed), summed
