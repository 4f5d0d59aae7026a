"""`SparseMoeBlock`: the MLP of a Mixtral / Qwen2-MoE / Qwen3-MoE sparse layer, with LoRA on its experts.

forward(x [T, H]) = sum over the top-k experts e of w_e * expert_e(x) (+ sigmoid(x Ws^T) * shared_expert(x) for
Qwen2-MoE), routing as models/moe_config.py states, experts computed on CUDA by kernels/fused_moe.py (Triton, no
host sync: decode steps run in CUDA graphs) and elsewhere by kernels/moe_reference.py (grouped torch, the oracle). Parameter names follow transformers 5: mlp.gate.weight [E, H] (the router,
never a LoRA target), mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I], mlp.shared_expert.*
(fused like a dense MLP), mlp.shared_expert_gate.weight [1, H]. With max_loras > 0 the experts own
`ExpertLoraWeights` slots, filled per adapter from `LoraAdapter.experts`; each token's slot comes from the step's
LoraMeta (`token_slot`).
"""

from __future__ import annotations

import torch
from torch import nn

from multilora_cli.kernels.expert_weights import ExpertLoraWeights
from multilora_cli.kernels.moe_reference import moe_reference, route
from multilora_cli.layers.context import get_context
from multilora_cli.layers.linear import FusedLinear
from multilora_cli.models.moe_config import MoeSpec


class MoeExperts(nn.Module):
    """E SwiGLU experts stored as 3D parameters (transformers 5's layout), plus their LoRA slots."""

    def __init__(self, spec: MoeSpec, hidden: int, max_loras: int, max_rank: int):
        super().__init__()
        E, inter = spec.num_experts, spec.intermediate_size
        self.num_experts, self.intermediate_size = E, inter
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * inter, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(E, hidden, inter), requires_grad=False)
        self.lora = (
            ExpertLoraWeights.empty(
                max_loras, max_rank, E, hidden, inter, self.gate_up_proj.dtype, self.gate_up_proj.device
            )
            if max_loras > 0
            else None
        )

    def forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        slot = None
        ctx = get_context()
        if self.lora is not None and ctx is not None and ctx.lora is not None and ctx.lora.segments:
            slot = ctx.lora.token_slot  # [T] int32, -1 = base
        if x.is_cuda:
            # imported here: its Triton kernels (and their JIT parsing) only for an MoE model on CUDA
            from multilora_cli.kernels.fused_moe import fused_moe

            return fused_moe(x, weights, experts, self.gate_up_proj, self.down_proj, slot, self.lora)
        slot = slot.to(torch.int64) if slot is not None else None
        return moe_reference(x, weights, experts, self.gate_up_proj, self.down_proj, slot, self.lora)


class SparseMoeBlock(nn.Module):
    def __init__(self, spec: MoeSpec, hidden: int, max_loras: int, max_rank: int, shared_mlp=None):
        """shared_mlp: Qwen2-MoE's shared expert (a dense MLP module of shared_intermediate_size), else None."""
        super().__init__()
        self.spec = spec
        self.gate = FusedLinear(hidden, [spec.num_experts])
        self.experts = MoeExperts(spec, hidden, max_loras, max_rank)
        self.shared_expert = shared_mlp
        self.shared_expert_gate = FusedLinear(hidden, [1]) if shared_mlp is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, H]
        weights, experts = route(self.gate(x), self.spec.top_k, self.spec.router, self.spec.norm_topk_prob)
        out = self.experts(x, weights, experts)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
