"""`ModelRunner`: owns the model, its KV cache and LoRA slots on one device; runs one scheduled step.

Per step it builds the metadata ONCE (token ids, positions, KV slots, attention context, LoRA segments), runs
the model over the flat token batch, takes the logits of the sequences that sample, and samples.
"""

from __future__ import annotations

from pathlib import Path

import torch

from multilora_cli.config import EngineConfig
from multilora_cli.engine.batch import ScheduledBatch
from multilora_cli.engine.sampler import Sampler, SamplingBatch
from multilora_cli.errors import EngineError
from multilora_cli.kernels import LoraMetaBuffers, build_lora_meta
from multilora_cli.layers.context import decode_context, prefill_context, reset_context, set_context
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.loader import load_model, resolve_dtype


def pick_device(requested: str) -> torch.device:
    """auto = CUDA when available, else CPU."""
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise EngineError("--device cuda was asked for but no CUDA device is visible",
                              hint="use --device cpu or auto")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class ModelRunner:
    """Model + paged KV cache + LoRA slot tensors on one device."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig, *, use_lora: bool = True,
                 lora_targets: set[str] | None = None):
        self.config = config
        self.model_config = model_config
        self.device = pick_device(config.device)
        self.dtype = resolve_dtype(model_config.torch_dtype, config.dtype, self.device)
        self.max_loras = config.max_loras if use_lora else 0
        self.model = load_model(Path(config.model), model_config, dtype=self.dtype, device=self.device,
                                max_loras=self.max_loras, max_lora_rank=config.max_lora_rank if use_lora else 0,
                                lora_targets=lora_targets)
        self._lora_modules = self.model.lora_modules()
        self.block_size = config.block_size
        self.num_blocks = self._size_kv_cache()
        self.model.allocate_kv_cache(self.num_blocks, self.block_size)
        self.vocab_size = model_config.vocab_size
        self.sampler = Sampler()
        max_step_tokens = config.max_num_batched_tokens + config.max_num_seqs
        self._meta_buffers = (LoraMetaBuffers(max_step_tokens, self.max_loras, self.device)
                              if self.device.type == "cuda" and self.max_loras else None)

    # --- sizing ----------------------------------------------------------------------------------------------
    def _size_kv_cache(self) -> int:
        per_block = self.model.kv_bytes_per_block(self.block_size)
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        if self.device.type != "cuda":
            return max(1, self.config.cpu_kv_cache_bytes // per_block)
        free, total = torch.cuda.mem_get_info(self.device)
        # activations of the largest step: a few [T, max(I, q+2kv)] buffers plus the sampled logits
        cfg = self.model_config
        widest = max(2 * cfg.intermediate_size, cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size)
        t = self.config.max_num_batched_tokens + self.config.max_num_seqs
        activations = 6 * t * widest * self.dtype.itemsize + 4 * self.config.max_num_seqs * cfg.vocab_size * 4
        budget = free - (1 - self.config.gpu_memory_utilization) * total - activations
        blocks = int(budget // per_block)
        if blocks < 1:
            raise EngineError(f"no GPU memory left for the KV cache ({free / 2**30:.1f} GiB free after loading "
                              "the model)", hint="raise --gpu-memory-utilization or lower --max-num-seqs")
        return blocks

    @property
    def max_model_len(self) -> int:
        limit = self.config.max_model_len or self.model_config.max_position_embeddings
        return min(limit, self.num_blocks * self.block_size)

    # --- LoRA slots ------------------------------------------------------------------------------------------
    def install_adapter(self, slot: int, name: str, adapter) -> None:
        """Copy a loaded adapter (adapters.peft.LoraAdapter) into `slot` of every LoRA layer."""
        for (layer, fused), module in self._lora_modules.items():
            module.lora.set_slot(slot, adapter.slices_for(layer, fused))

    def evict_adapter(self, slot: int, name: str) -> None:
        for module in self._lora_modules.values():
            module.lora.clear_slot(slot)

    # --- one step --------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[int]:
        """Run `batch` through the model; returns one sampled token id per `batch.sampled_seqs()`."""
        dev = self.device
        input_ids = torch.tensor(batch.input_ids(), dtype=torch.long).to(dev, non_blocking=True)
        positions = torch.tensor(batch.positions(), dtype=torch.long).to(dev, non_blocking=True)
        lora = None
        if self.max_loras and any(s >= 0 for s in batch.slots):
            token_slots = batch.token_lora_slots()
            lora = (self._meta_buffers.build(token_slots) if self._meta_buffers is not None
                    else build_lora_meta(token_slots, dev))
        tables = batch.block_tables()
        if batch.is_decode_only:
            ctx = decode_context(batch.seq_lens(), tables, self.block_size, dev, lora=lora)
        else:
            ctx = prefill_context(batch.num_new_tokens, batch.seq_lens(), tables, self.block_size, dev, lora=lora)
        set_context(ctx)
        try:
            hidden = self.model(input_ids, positions)  # [T, H]
            idx = batch.logits_indices()
            if not idx:
                return []
            rows = torch.tensor(idx, dtype=torch.long).to(dev, non_blocking=True)
            logits = self.model.compute_logits(hidden.index_select(0, rows))  # [N, V] fp32
        finally:
            reset_context()
        sb = SamplingBatch.for_seqs(batch.sampled_seqs(), logits.shape[-1], dev)
        return self.sampler(logits, sb).tolist()
