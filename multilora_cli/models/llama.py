"""One decoder for Llama 2/3/3.1, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 (text) and Phi-3 / Phi-4, switched by
`ModelConfig` toggles.

Differences handled: rope scaling (default / linear / llama3 / longrope, partial rotary), qkv bias (Qwen2),
per-head q/k RMSNorm and explicit head_dim (Qwen3, Gemma 3), sliding window (Mistral, Phi-3, Gemma's local
layers), tied embeddings; Gemma: (1 + w) RMSNorms, norms after attention and around the MLP, scaled embeddings,
GeGLU, query_pre_attn_scalar, attention and final logit soft-capping (Gemma 2), a second RoPE base for the
local layers (Gemma 3). Projections are fused (qkv_proj = q|k|v, gate_up_proj = gate|up); with `max_loras > 0`
the targeted fused modules are `LoRALinear`s. Tokens are a flat batch [T] (sequences packed back to back);
attention layout comes from the StepContext. The decoder's modules are in models/llama_layers.py; here the causal
LM around them: LM head, LoRA module lookup, vocab adapter slots, KV cache.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from multilora_cli.kernels.fp8 import Fp8Scheme
from multilora_cli.layers.linear import FusedLinear
from multilora_cli.layers.lora import LoRALinear
from multilora_cli.layers.vocab_lora import VocabAdapters
from multilora_cli.models.config import FUSED_MODULES, ModelConfig
from multilora_cli.models.llama_layers import LinearFactory, LlamaModel
from multilora_cli.models.moe import MoeExperts, SparseMoeBlock


class LlamaForCausalLM(nn.Module):
    """Llama-family causal LM over a flat token batch; attention layout from `layers.context.get_context()`.

    Parameter names follow Hugging Face except for the fused projections (see `models.loader`).
    Build it on its device (e.g. `with torch.device("cuda")`), since LoRA slot tensors are not moved by `.to`.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        max_loras: int = 0,
        max_lora_rank: int = 0,
        lora_targets: set[str] | None = None,
        fp8: Fp8Scheme | None = None,
    ):
        super().__init__()
        targets = set(FUSED_MODULES if lora_targets is None else lora_targets)
        unknown = targets - set(FUSED_MODULES)
        if unknown:
            raise ValueError(f"unknown LoRA target modules {sorted(unknown)}; fused modules: {FUSED_MODULES}")
        if max_loras > 0 and max_lora_rank <= 0:
            raise ValueError("max_lora_rank must be positive when max_loras > 0")
        self.config = config
        self.max_loras, self.max_lora_rank = max_loras, max_lora_rank
        self.fp8 = fp8  # how the decoder projections run when the base is FP8 (kernels/fp8.py); None: not FP8
        self.model = LlamaModel(config, LinearFactory(max_loras, max_lora_rank, targets, fp8))
        self.lm_head = FusedLinear(config.hidden_size, [config.vocab_size])
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.block_size = 0
        self.num_blocks = 0

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def long_rope_from(self) -> int | None:
        """LongRoPE: the position from which tokens take the long factors (original_max_position_embeddings);
        None without LongRoPE."""
        return self.model.rotary.long_from

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: [T] -> final-normed hidden states [T, hidden]."""
        return self.model(input_ids, positions)

    def enable_vocab(self, **parts) -> VocabAdapters:
        """Give the model slots for embed_tokens / lm_head adapters (layers/vocab_lora.py; `parts`: its
        embed_lora, head_lora, embed_full, head_full), before CUDA graphs are captured."""
        cfg = self.config
        self.model.vocab = VocabAdapters(
            self.max_loras,
            self.max_lora_rank,
            cfg.vocab_size,
            cfg.hidden_size,
            dtype=self.dtype,
            device=self.device,
            **parts,
        )
        return self.model.vocab

    def _head(self, logits: torch.Tensor, hidden: torch.Tensor, slots) -> torch.Tensor:
        vocab = self.model.vocab
        if vocab is None or slots is None:
            return logits
        return vocab.head_logits(logits, hidden, slots)

    def compute_logits(self, hidden: torch.Tensor, upcast: bool = True, slots=None) -> torch.Tensor:
        """hidden: [N, hidden] (e.g. each sequence's last token) -> logits [N, vocab] float32 (upcast=False: in
        the model dtype, e.g. for a greedy argmax, which picks the same index from either). Gemma 2's final
        soft-capping tanh(x / cap) * cap is applied here, in float32, before any sampler sees the logits.
        slots: [N] host ints, each row's LoRA slot, for lm_head adapters (layers/vocab_lora.py); None: base."""
        return self._finish(self.lm_head(hidden), hidden, slots, upcast)

    def _finish(self, logits: torch.Tensor, hidden: torch.Tensor, slots, upcast: bool) -> torch.Tensor:
        """The base LM-head product in the model dtype -> `compute_logits`'s result (head adapters, soft-cap)."""
        logits = self._head(logits, hidden, slots)
        cap = self.config.final_softcap
        if cap is not None:
            capped = torch.tanh(logits.float() / cap) * cap
            return capped if upcast else capped.to(logits.dtype)
        return logits.float() if upcast else logits

    def head_product_fp32(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, hidden] -> the base LM head's hidden Wᵀ (+ b) [N, vocab] in fp32, accumulated and kept in
        fp32 (no adapter, no soft-cap). CUDA: one GEMM of the model-dtype operands with an fp32 output; elsewhere
        fp32 math. An fp32 model runs its own `lm_head` call, the very GEMM `compute_logits` runs."""
        w, b = self.lm_head.weight, self.lm_head.bias
        if w.dtype == torch.float32:
            return self.lm_head(hidden.float())
        if hidden.is_cuda:
            logits = torch.mm(hidden.to(w.dtype), w.t(), out_dtype=torch.float32)
        else:
            logits = torch.nn.functional.linear(hidden.float(), w.float())
        return logits + b.float() if b is not None else logits

    def compute_logits_fp32(self, hidden: torch.Tensor, slots=None) -> torch.Tensor:
        """hidden: [N, hidden] -> fp32 logits [N, vocab] whose LM-head products are accumulated and kept in fp32,
        never rounded to the model dtype (logprobs: a bf16 logit of magnitude 8 is off by up to 0.03, more than
        a log-likelihood may be): `head_product_fp32`, then lm_head adapters in fp32 and Gemma 2's final
        soft-capping as in `compute_logits`; `slots` as there."""
        return self._finish_fp32(self.head_product_fp32(hidden), hidden, slots)

    def _finish_fp32(self, logits: torch.Tensor, hidden: torch.Tensor, slots) -> torch.Tensor:
        logits = self._head(logits, hidden, slots)
        cap = self.config.final_softcap
        return torch.tanh(logits / cap) * cap if cap is not None else logits

    def compute_logits_pair(
        self, hidden: torch.Tensor, rows: np.ndarray | None, slots=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ONE LM-head GEMM for both the sampler and the logprobs: hidden [N, hidden], rows [R] host ints (None:
        every row), slots [N] host ints or None -> (`compute_logits(hidden, upcast=False, slots)` [N, vocab] in the model dtype,
        `compute_logits_fp32` of those rows [R, vocab]).

        The model-dtype logits are `head_product_fp32` rounded to the model dtype, then the head adapters and the
        soft-cap exactly as `compute_logits` applies them: they equal `compute_logits`'s bits only where the
        model-dtype GEMM equals the fp32-output GEMM rounded (models/head_check.py decides where; an fp32 model
        always: both are the same GEMM). The fp32 rows take the head adapters and soft-cap in fp32."""
        prod = self.head_product_fp32(hidden)  # [N, V] fp32
        at = (
            None
            if rows is None
            else torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(hidden.device, non_blocking=True)
        )
        if prod.dtype == self.dtype:  # fp32 model: one tensor, the sampler reads it and leaves it unchanged
            logits = self._finish(prod, hidden, slots, upcast=False)
            return logits, (logits if at is None else logits.index_select(0, at))
        logits = self._finish(prod.to(self.dtype), hidden, slots, upcast=False)  # (a new tensor: prod stays)
        if at is None:
            return logits, self._finish_fp32(prod, hidden, slots)
        rs = None if slots is None else np.asarray(slots)[rows]
        return logits, self._finish_fp32(prod.index_select(0, at), hidden.index_select(0, at), rs)

    def lora_modules(self) -> dict[tuple[int, str], LoRALinear]:
        """{(layer index, fused module name): LoRALinear} for every LoRA-wrapped module."""
        found: dict[tuple[int, str], LoRALinear] = {}
        for i, layer in enumerate(self.model.layers):
            for name, mod in (
                ("qkv_proj", layer.self_attn.qkv_proj),
                ("o_proj", layer.self_attn.o_proj),
                ("gate_up_proj", getattr(layer.mlp, "gate_up_proj", None)),
                ("down_proj", getattr(layer.mlp, "down_proj", None)),
            ):
                if isinstance(mod, LoRALinear):
                    found[(i, name)] = mod
            shared = getattr(layer.mlp, "shared_expert", None)  # Qwen2-MoE
            for name in ("gate_up_proj", "down_proj") if shared is not None else ():
                if isinstance(getattr(shared, name), LoRALinear):
                    found[(i, f"shared_expert.{name}")] = getattr(shared, name)
        return found

    def expert_lora_modules(self) -> dict[int, MoeExperts]:
        """{layer index: MoeExperts} of every sparse layer whose experts hold LoRA slots."""
        return {
            i: layer.mlp.experts
            for i, layer in enumerate(self.model.layers)
            if isinstance(layer.mlp, SparseMoeBlock) and layer.mlp.experts.lora is not None
        }

    # KV cache -------------------------------------------------------------------------------------
    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes of K and V cache, all layers, for one block of `block_size` tokens in the model dtype."""
        return self.config.kv_bytes_per_token(self.dtype.itemsize) * block_size

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        """Give every layer zeroed K/V caches [num_blocks, block_size, num_kv_heads, head_dim] (one allocation)."""
        cfg = self.config
        cache = torch.zeros(
            cfg.num_hidden_layers,
            2,
            num_blocks,
            block_size,
            cfg.num_key_value_heads,
            cfg.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        for i, layer in enumerate(self.model.layers):
            layer.self_attn.attn.set_cache(cache[i, 0], cache[i, 1])
        self.num_blocks, self.block_size = num_blocks, block_size

    def free_kv_cache(self) -> None:
        for layer in self.model.layers:
            layer.self_attn.attn.set_cache(None, None)
        self.num_blocks = self.block_size = 0
