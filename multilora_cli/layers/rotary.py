"""Rotary position embedding (non-interleaved "rotate half" layout, as in Hugging Face Llama).

Frequencies: default, "linear" (positions / factor), "llama3" (Llama 3.1 wavelength-banded scaling) and
"longrope" (Phi-3: per-frequency short or long factors, cos/sin times an attention factor). cos/sin are computed
per step from the positions (no max-length table), in float32. A rotary dimension below head_dim (Phi-4-mini's
partial_rotary_factor) rotates the leading dims of each head and passes the rest through.
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
    raise ModelError(f"rope scaling {kind!r} is not supported", hint="supported: linear, llama3, longrope")


def longrope_frequencies(dim: int, theta: float, factors: list[float]) -> torch.Tensor:
    """[dim // 2] float32 LongRoPE inverse frequencies 1 / (factor_i * theta ** (2i / dim)), computed as
    transformers' `_compute_longrope_parameters` computes them (same ops, same bits)."""
    ext = torch.tensor(factors, dtype=torch.float32)
    return 1.0 / (ext * theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


class RotaryEmbedding(nn.Module):
    """`forward(positions [T], long [T] bool | None) -> (cos, sin)` each [T, dim] float32, shared by the layers
    of a step that use this rope. `dim`: the rotary dimension (head_dim, or less with a partial rotary factor).

    LongRoPE (transformers' semantics): a forward whose sequence extends past original_max_position_embeddings
    uses the long factors, else the short ones, and cos/sin are scaled by the attention factor either way. Per
    token that is `long` (what the step says for its prompt tokens: engine/runner.py), else position >= original.
    """

    def __init__(self, dim: int, theta: float, scaling: dict | None = None):
        super().__init__()
        self.head_dim = dim
        self.long_from: int | None = None  # LongRoPE: positions from here on take the long factors
        self.attention_factor = 1.0
        if (scaling or {}).get("rope_type") == "longrope":
            short = longrope_frequencies(dim, theta, scaling["short_factor"])
            self.register_buffer("inv_freq", short, persistent=False)
            self.register_buffer("long_inv_freq", longrope_frequencies(dim, theta, scaling["long_factor"]), False)
            self.long_from = int(scaling["original_max_position_embeddings"])
            self.attention_factor = float(scaling["attention_factor"])
        else:
            self.register_buffer("inv_freq", inv_frequencies(dim, theta, scaling), persistent=False)

    def forward(self, positions: torch.Tensor, long: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        inv = self.inv_freq.float()[None, :]  # [1, D/2]
        if self.long_from is not None:
            if long is None:
                long = positions >= self.long_from
            inv = torch.where(long[:, None], self.long_inv_freq.float()[None, :], inv)  # [T, D/2]
        freqs = positions.float()[:, None] * inv  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
        if self.long_from is not None:
            return emb.cos() * self.attention_factor, emb.sin() * self.attention_factor
        return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D] rotated by position; cos/sin: [T, R] float32 (cast to x's dtype like HF), R <= D: the
    first R dims of each head rotate, the rest pass through (partial rotary)."""
    rd = cos.shape[-1]
    if rd < x.shape[-1]:
        return torch.cat((apply_rotary(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)
    if x.is_cuda:  # one launch instead of ~7 (kernels/norm_rope.py)
        from multilora_cli.kernels import norm_rope

        if norm_rope.enabled(x):
            return norm_rope.rotary(x, cos, sin)
    cos = cos.to(x.dtype)[:, None, :]
    sin = sin.to(x.dtype)[:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
