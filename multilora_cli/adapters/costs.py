"""What served features beyond plain LoRA pairs cost in GPU slot memory (inspect, economics, slot sizing)."""

from __future__ import annotations

from multilora_cli.models.config import ModelConfig

# the PEFT projections behind the engine's fused LoRA modules; every one gets slots (engine/slot_budget.py)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def dora_slot_bytes(config: ModelConfig) -> int:
    """Extra bytes per GPU slot in a run with a DoRA adapter: a float32 scale per output feature of every LoRA
    module (kernels/weights.py `LoraWeights.dora`), whatever the adapter in the slot (plain-LoRA slots hold ones).
    Llama-3-8B: 4 x 43,008 x 32 = 5.5 MB, against 83.9 MB of A / B at rank 16."""
    per_layer = sum(config.linear_shape(m)[1] for m in PROJECTIONS)
    return 4 * per_layer * config.num_hidden_layers


def vocab_lora_slot_bytes(config: ModelConfig, module: str, rank: int, itemsize: int = 2) -> int:
    """Bytes per GPU slot of LoRA on embed_tokens or lm_head (layers/vocab_lora.py) at `rank`: embed_tokens holds
    A transposed [V, R], B [H, R] and an identity A [R, R]; lm_head A [R, H] and B [V, R]. Llama-3-8B at rank 16:
    4.2 MB each (V 128,256)."""
    v, h = config.vocab_size, config.hidden_size
    numel = rank * (v + h + rank) if module == "embed_tokens" else rank * (v + h)
    return numel * itemsize


def full_copy_bytes(config: ModelConfig, itemsize: int = 2) -> int:
    """Bytes of one modules_to_save copy of embed_tokens or lm_head [V, H] on the GPU (one per slot holding an
    adapter with one): Llama-3-8B 1.05 GB in bf16."""
    return config.vocab_size * config.hidden_size * itemsize


def vocab_slot_bytes(config: ModelConfig, scans, max_rank: int, itemsize: int) -> int:
    """Bytes per GPU slot that a run's embed_tokens / lm_head adapters add (`scans`: each adapter's
    adapters/vocab.VocabScan): the vocabulary-sized LoRA slots when any adapter has such a LoRA, and a full copy
    per module when any adapter has a modules_to_save copy of it (the engine keeps up to one per slot)."""
    total = 0
    for module in ("embed_tokens", "lm_head"):
        if any(module in v.lora for v in scans):
            total += vocab_lora_slot_bytes(config, module, max_rank, itemsize)
        if any(module in v.full for v in scans):
            total += full_copy_bytes(config, itemsize)
    return total
