"""Rotary position embedding (non-interleaved "rotate half" layout, as in Hugging Face Llama).

Frequencies: default, "linear" (positions / factor) and "llama3" (Llama 3.1 wavelength-banded scaling).
cos/sin are computed per step from the positions (no max-length table), in float32.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from multilora_cli.errors import ModelError


def inv_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies after rope scaling."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type")
    if kind is None:
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        # long wavelengths (low frequencies) are slowed by `factor`, short ones kept, the band between blended
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
        return torch.where(medium, blended, scaled)
    raise ModelError(f"rope scaling {kind!r} is not supported", hint="supported: linear, llama3")


class RotaryEmbedding(nn.Module):
    """`forward(positions [T]) -> (cos, sin)` each [T, head_dim] float32, shared by all layers of a step."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.register_buffer("inv_freq", inv_frequencies(head_dim, theta, scaling), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
        return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D] rotated by position; cos/sin: [T, D] float32 (cast to x's dtype like HF)."""
    if x.is_cuda:  # one launch instead of ~7 (kernels/norm_rope.py)
        from multilora_cli.kernels import norm_rope

        if norm_rope.enabled(x):
            return norm_rope.rotary(x, cos, sin)
    cos = cos.to(x.dtype)[:, None, :]
    sin = sin.to(x.dtype)[:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
