"""DoRA's per-output-feature scale applied per token: `apply_dora(y, w, meta, bias)`.

PEFT's DoRA output for a module W (bias b) with LoRA (A, B, scaling s) and magnitude m [out] is
    y = g ⊙ (x Wᵀ + s · (x Aᵀ) Bᵀ) + b,   g = m / ||W + s·B·A||_row   (one norm per output feature, detached)
(peft/tuners/lora/dora.py: `(g - 1) * base_result + g * s * lora_result` added to x Wᵀ + b). `add_lora` has made
y = x Wᵀ + b + s · (x Aᵀ) Bᵀ, so this step is y <- g ⊙ y + (1 - g) ⊙ b per token. g is computed once per adapter
when it enters a slot (engine/dora.py) and kept in `LoraWeights.dora`; plain-LoRA slots and the base row hold ones,
and g = 1 leaves y bit-identical (y * 1 + 0), so rows of other adapters in the same batch are untouched.
"""

from __future__ import annotations

import torch

from multilora_cli.kernels.meta import LoraMeta
from multilora_cli.kernels.weights import LoraWeights


def apply_dora(y: torch.Tensor, w: LoraWeights, meta: LoraMeta, bias: torch.Tensor | None = None) -> None:
    """y[t, :] = g[slot(t), :] * y[t, :] + (1 - g[slot(t), :]) * bias for every adapted token t (in place): one
    Triton pass where `add_lora` takes the Triton path (kernels/dora_scale.py), torch ops elsewhere."""
    from multilora_cli.kernels import use_triton

    if use_triton(y):
        from multilora_cli.kernels.dora_scale import dora_scale_triton

        dora_scale_triton(y, w.dora, meta.token_slot, bias)
        return
    apply_dora_torch(y, w, meta, bias)


def apply_dora_torch(y: torch.Tensor, w: LoraWeights, meta: LoraMeta, bias: torch.Tensor | None = None) -> None:
    """`apply_dora` in torch ops, over every row (base rows times exactly 1).

    y: [T, out] (model dtype), w.dora: [max_loras + 1, out] float32 (row max_loras = the base's ones, which
    slot -1 indexes), meta.token_slot: [T] int32, bias: [out] or None. Computed in float32, rounded once.
    Graph-capturable (no host sync): every row is scaled, base rows by exactly 1.
    """
    g = w.dora[meta.token_slot.long()]  # [T, out] float32; slot -1 wraps to the last row (ones)
    if y.dtype == torch.float32 and bias is None:
        y.mul_(g)
        return
    out = y.float() * g
    if bias is not None:
        out.addcmul_(1.0 - g, bias.float().expand_as(out))
    y.copy_(out)


def apply_dora_reference(y: torch.Tensor, g_per_slot: torch.Tensor, token_slot: list[int], bias=None) -> torch.Tensor:
    """Row-by-row reference of `apply_dora` (tests): slot -1 rows unchanged."""
    out = y.clone().float()
    for t, s in enumerate(token_slot):
        if s >= 0:
            b = 0.0 if bias is None else bias.float()
            out[t] = g_per_slot[s] * out[t] + (1 - g_per_slot[s]) * b
    return out.to(y.dtype)
