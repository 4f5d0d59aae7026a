"""Inputs for the fused MoE kernel tests: routings by popularity pattern and expert LoRA slots of differing ranks."""

from __future__ import annotations

import torch

from multilora_cli.kernels.expert_weights import ExpertLoraWeights


def routing(pattern: str, T: int, E: int, K: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, K] fp32, experts [T, K] int64), K distinct experts per row.
    one: every token picks experts 0..K-1 (one hot block); uniform: random; sparse: only experts 0..K (the
    others stay empty); a row's weights sum to 1."""
    if pattern == "one":
        experts = torch.arange(K).repeat(T, 1)
    elif pattern == "sparse":
        experts = torch.stack([torch.randperm(K + 1, generator=g)[:K] for _ in range(T)])
    else:
        experts = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    weights = torch.softmax(torch.randn(T, K, generator=g), dim=-1)
    return weights, experts


def expert_lora(L: int, R: int, E: int, H: int, inter: int, ranks, g, dtype, device, amp: float = 0.1):
    """Slots 0..L-1 with ranks `ranks` (0 = left empty); slot 1 adapts only gate and down (no up); slot 3's gate
    and up share one A (as PEFT's lora_A of gate_up_proj: the fused shrink reads it once)."""
    lora = ExpertLoraWeights.empty(L, R, E, H, inter, dtype, device)
    for s, r in enumerate(ranks):
        if r == 0:
            continue
        parts = {
            p: (
                (torch.randn(E, r, i, generator=g) * amp).to(dtype).to(device),
                (torch.randn(E, o, r, generator=g) * amp).to(dtype).to(device),
                0.5 + s,
            )
            for p, i, o in (("gate", H, inter), ("up", H, inter), ("down", inter, H))
        }
        if s == 1:
            del parts["up"]
        if s == 3:
            parts["up"] = (parts["gate"][0], *parts["up"][1:])
        lora.set_slot(s, parts)
    assert lora.shared.tolist() == [int(s == 3 and r > 0) for s, r in enumerate(ranks)]
    return lora
