"""How many GPU adapter slots a run gets when `--max-loras` is not given.

More slots than the run has adapters buy nothing; fewer make adapters queue for slots and reload. On an H200,
Llama-3-8B shapes, 64 rank-16 adapters, 1024 requests:
64 slots 14,074 tok/s, 16 slots 12,528 (0.89x), 8 slots 11,001 (0.78x); and 8 adapters ran as fast in 64 slots
as in 8 (14,633 vs 14,073 tok/s). So on a GPU the default is one slot per adapter, as long as the slots take at
most SLOT_SHARE of the memory the KV cache could otherwise use (what is left beside the base weights). On CPU
no kernel gains from slots and they cost host memory: the default stays small.
"""

from __future__ import annotations

from multilora_cli.models.config import ModelConfig
from multilora_cli.models.moe_config import moe_slot_numel, moe_weight_numel

SLOT_SHARE = 0.10  # of the GPU memory left beside the weights (Llama-3-8B bf16, rank 16: 80 GB -> 64 slots)
MAX_AUTO_LORAS = 64  # the default never allocates more (decode graphs and metadata are sized by the slot count)
CPU_MAX_LORAS = 8  # the default on CPU (vLLM's --max-loras default is 1)

# the PEFT projections behind the engine's fused LoRA modules (models/config.FUSED_MODULES); every one gets slots
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def slot_bytes(config: ModelConfig, max_rank: int, itemsize: int) -> int:
    """Bytes of one GPU slot: A [R, in] and B [out, R] of all seven projections in every layer (the engine
    allocates them whatever the adapters target); on a MoE base, the experts' slots too (E experts x rank)."""
    if config.moe is not None:
        return moe_slot_numel(config, max_rank) * itemsize
    per_layer = sum(max_rank * sum(config.linear_shape(m)) for m in PROJECTIONS)
    return per_layer * config.num_hidden_layers * itemsize


def weight_bytes(config: ModelConfig, itemsize: int) -> int:
    """Bytes of the base model's matrices (embeddings, projections, LM head; norms and biases are noise)."""
    per_layer = sum(i * o for i, o in map(config.linear_shape, PROJECTIONS))
    if config.moe is not None:  # every expert of every sparse layer
        per_layer, layers = moe_weight_numel(config), 1
    else:
        layers = config.num_hidden_layers
    embed = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
    return (per_layer * layers + embed) * itemsize


def auto_max_loras(n_adapters: int, one_slot: int, spare: int | None) -> int:
    """Slots for a run of `n_adapters` when the user gave none. `spare`: GPU bytes left beside the weights
    (None on CPU). At least 1; never more than the adapters, MAX_AUTO_LORAS, or SLOT_SHARE of `spare`."""
    n = max(1, n_adapters)
    if spare is None:
        return min(n, CPU_MAX_LORAS)
    fit = int(SLOT_SHARE * max(spare, 0) // max(one_slot, 1))
    return max(1, min(n, MAX_AUTO_LORAS, fit))


def spare_gpu_bytes(device: str, config: ModelConfig, itemsize: int, utilization: float) -> int | None:
    """GPU bytes the engine may use (total x `utilization`) less the base weights, on the GPU a run on `device`
    ("auto" | "cuda" | "cpu", engine/device.resolve_device) would use; None when it runs on CPU."""
    import torch

    from multilora_cli.engine.device import resolve_device

    if resolve_device(device) == "cpu":
        return None
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return int(total * utilization) - weight_bytes(config, itemsize)
