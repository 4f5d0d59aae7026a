"""How big the model runner's device buffers are: the KV cache (blocks), the staging buffers for slot loads, and
the largest prefill step the precompile dry-runs. All are sized once, when the runner starts, after the model
and the LoRA slots are on the device (their bytes are no longer free)."""

from __future__ import annotations

import torch

from multilora_cli.config import EngineConfig
from multilora_cli.errors import EngineError
from multilora_cli.models.config import ModelConfig

# device copies of packed adapters made ahead of their slot loads (engine/staging.py): at most 8, within 1 GiB of
# GPU memory, at least 2. 8 buffers let more loads find their copy made (H200, Llama-3-8B rank 16: 11,440 vs
# 11,101 tok/s with 2, 64 adapters cold; 7,751 vs 7,399 with 256 adapters in 64 slots)
STAGING_BUFFERS = 8
STAGING_BYTES = 1 << 30


def staging_buffers(slot_bytes: int) -> int:
    """How many staging buffers of `slot_bytes` (one slot of every LoRA layer) to keep: 8 rank-16 Llama-3-8B
    slots (84 MB each), 3 at rank 64 (336 MB)."""
    return max(2, min(STAGING_BUFFERS, STAGING_BYTES // max(slot_bytes, 1)))


def window_kv_blocks(config: EngineConfig, model_config: ModelConfig) -> int | None:
    """Most KV blocks one sequence holds at once when every layer slides with one window W: a prefill chunk of at
    most max_num_batched_tokens and the W - 1 positions before it (BlockManager.blocks_at_once). None without such
    a window, or with LongRoPE (a prompt shorter than its switch keeps its blocks up to it: Scheduler._slide)."""
    window = model_config.kv_window
    if window is None or (model_config.rope_scaling or {}).get("rope_type") == "longrope":
        return None
    return -(-(window - 1 + config.max_num_batched_tokens) // config.block_size) + 1


def input_kv_blocks(config: EngineConfig, max_position_embeddings: int, window_blocks: int | None = None) -> int | None:
    """KV blocks that hold every sequence the input can run (config.max_decode_batch) at max_model_len at once
    (or `window_blocks`, `window_kv_blocks`, if fewer), plus 2% (the scheduler's admission watermark is 1%) and one
    block per sequence (a run-ahead step's slot); None when the input's size is unknown. More blocks could never be
    used: no sequence waits for KV, none is preempted and no cached prefix is evicted, so the results are those of
    a cache sized by memory. A 14-line demo job zeroed a 1 GiB cache on CPU for ~14 x 512 tokens (0.55 s of a
    2.5 s run)."""
    if config.max_decode_batch is None:
        return None
    limit = config.max_model_len or max_position_embeddings
    per_seq = -(-limit // config.block_size)
    if window_blocks is not None:
        per_seq = min(per_seq, window_blocks)
    blocks = config.max_decode_batch * (per_seq + 1)
    return blocks + blocks // 50 + 2


def precompile_tokens(config: EngineConfig) -> int:
    """The largest prefill step the precompile dry-runs: max_num_batched_tokens, or less when the input's prompts
    are known to be fewer tokens (config.prompt_tokens_hint, plus a decode token per sequence of a mixed step)."""
    if config.prompt_tokens_hint is None:
        return config.max_num_batched_tokens
    hint = config.prompt_tokens_hint + (config.max_decode_batch or config.max_num_seqs)
    return max(1, min(config.max_num_batched_tokens, hint))


def kv_cache_blocks(
    config: EngineConfig, model_config: ModelConfig, per_block: int, device: torch.device, dtype: torch.dtype
) -> int:
    """KV blocks: config.num_kv_blocks, else what memory allows (capped by `input_kv_blocks`). `per_block`: the
    model's KV bytes per block (Model.kv_bytes_per_block)."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    blocks = _memory_kv_blocks(config, model_config, per_block, device, dtype)
    cap = input_kv_blocks(config, model_config.max_position_embeddings, window_kv_blocks(config, model_config))
    return blocks if cap is None else min(cap, blocks)


def _memory_kv_blocks(
    config: EngineConfig, cfg: ModelConfig, per_block: int, device: torch.device, dtype: torch.dtype
) -> int:
    if device.type != "cuda":
        return max(1, config.cpu_kv_cache_bytes // per_block)
    free, total = torch.cuda.mem_get_info(device)
    # activations of the largest step: a few [T, max(I, q+2kv)] buffers plus the sampled logits
    widest = max(2 * cfg.intermediate_size, cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size)
    t = config.max_num_batched_tokens + config.max_num_seqs
    activations = 6 * t * widest * dtype.itemsize + 4 * config.max_num_seqs * cfg.vocab_size * 4
    budget = free - (1 - config.gpu_memory_utilization) * total - activations
    blocks = int(budget // per_block)
    if blocks < 1:
        raise EngineError(
            f"no GPU memory left for the KV cache ({free / 2**30:.1f} GiB free after loading the model)",
            hint="raise --gpu-memory-utilization, or lower --max-num-seqs or --max-loras",
        )
    return blocks
