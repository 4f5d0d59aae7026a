"""The modules of the one decoder (models/llama.py): the projection factory (plain, LoRA, FP8 `FusedLinear`s),
attention, the dense MLP (SwiGLU / GeGLU), a sparse layer's MoE block, the decoder layer with its norms (Llama's
pre-norms, Gemma's sandwich norms) and the model body (embeddings, rotary tables, layers, final norm), over a
flat token batch [T] whose attention layout comes from the StepContext.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from multilora_cli.kernels.fp8 import Fp8Scheme
from multilora_cli.layers.attention import Attention
from multilora_cli.layers.context import get_context
from multilora_cli.layers.linear import FusedLinear
from multilora_cli.layers.lora import LoRALinear
from multilora_cli.layers.norm import GemmaRMSNorm, RMSNorm
from multilora_cli.layers.rotary import RotaryEmbedding, apply_rotary
from multilora_cli.layers.vocab_lora import VocabAdapters
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.moe import SparseMoeBlock


class LinearFactory:
    """Builds a plain `FusedLinear` or, for targeted modules when LoRA is on, a `LoRALinear`; FP8 ones when the
    base is FP8 (`fp8`: every decoder projection; embeddings, norms and lm_head stay in the compute dtype)."""

    def __init__(self, max_loras: int, max_rank: int, targets: set[str], fp8: Fp8Scheme | None = None):
        self.max_loras, self.max_rank, self.targets, self.fp8 = max_loras, max_rank, targets, fp8

    def __call__(self, name: str, in_features: int, slices: list[int], bias: bool) -> FusedLinear:
        if self.max_loras > 0 and name in self.targets:
            return LoRALinear(in_features, slices, bias, max_loras=self.max_loras, max_rank=self.max_rank, fp8=self.fp8)
        return FusedLinear(in_features, slices, bias, fp8=self.fp8)


def norm_class(cfg: ModelConfig) -> type[RMSNorm]:
    """Gemma's (1 + w) float32 RMSNorm or Llama's."""
    return GemmaRMSNorm if cfg.norm_offset else RMSNorm


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, linear: LinearFactory):
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.qkv_proj = linear("qkv_proj", cfg.hidden_size, [cfg.q_size, cfg.kv_size, cfg.kv_size], cfg.attention_bias)
        self.o_proj = linear("o_proj", cfg.q_size, [cfg.hidden_size], cfg.o_bias)
        norm = norm_class(cfg)
        self.q_norm = norm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = norm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.attn = Attention(
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            cfg.attn_scale,
            cfg.layer_sliding_window(layer_idx),
            softcap=cfg.attn_softcap,
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [T, hidden]
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = self.attn(q, k, v)  # [T, H, D]
        return self.o_proj(o.reshape(T, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, linear: LinearFactory, intermediate_size: int | None = None):
        super().__init__()
        i = intermediate_size or cfg.intermediate_size
        self.intermediate_size = i
        self.gelu = cfg.hidden_act == "gelu_pytorch_tanh"  # GeGLU (Gemma), else SwiGLU
        self.gate_up_proj = linear("gate_up_proj", cfg.hidden_size, [i, i], cfg.mlp_bias)
        self.down_proj = linear("down_proj", i, [cfg.hidden_size], cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gelu:  # torch ops on every device: the fused activation kernels are SiLU's
            gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)  # [T, I] each
            return self.down_proj(F.gelu(gate, approximate="tanh") * up)
        if x.is_cuda:  # one launch over the fused output (kernels/norm_rope.py)
            from multilora_cli.kernels import norm_rope

            if norm_rope.enabled(x):
                # a LoRA layer adds its delta inside the activation's kernel (kernels/sgmv_silu.py)
                fused = getattr(self.gate_up_proj, "forward_silu_mul", None)
                if fused is not None:
                    return self.down_proj(fused(x))
                return self.down_proj(norm_rope.silu_mul(self.gate_up_proj(x)))
        gate_up = self.gate_up_proj(x)  # [T, 2I]
        gate, up = gate_up.split(self.intermediate_size, dim=-1)  # [T, I] each
        return self.down_proj(F.silu(gate) * up)


def _sparse_block(cfg: ModelConfig, linear: LinearFactory) -> SparseMoeBlock:
    """A MoE layer's MLP (models/moe.py); Qwen2-MoE's shared expert is a dense MLP whose projections are LoRA
    targets like a dense layer's (lora_modules: "shared_expert.gate_up_proj" / "shared_expert.down_proj")."""
    spec = cfg.moe
    shared_linear = LinearFactory(linear.max_loras, linear.max_rank, {"gate_up_proj", "down_proj"})
    shared = LlamaMLP(cfg, shared_linear, spec.shared_intermediate_size) if spec.shared_intermediate_size else None
    return SparseMoeBlock(spec, cfg.hidden_size, linear.max_loras, linear.max_rank, shared)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, linear: LinearFactory):
        super().__init__()
        norm = norm_class(cfg)
        self.rope = cfg.layer_rope(layer_idx)
        self.input_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, layer_idx, linear)
        # Gemma: post_attention_layernorm normalises the attention output; pre/post_feedforward wrap the MLP
        self.post_attention_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.pre_feedforward_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps) if cfg.sandwich_norms else None
        self.post_feedforward_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps) if cfg.sandwich_norms else None
        self.mlp = LlamaMLP(cfg, linear) if not cfg.is_sparse_layer(layer_idx) else _sparse_block(cfg, linear)

    def forward(
        self, h: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream is carried as (h, residual) with stream = residual + h (residual None: h alone), so
        each add is fused into the norm that follows it. Returns (mlp output, stream before it): [T, hidden]."""
        if residual is None:
            x, residual = self.input_layernorm(h), h
        else:
            x, residual = self.input_layernorm.forward_add(h, residual)
        if self.pre_feedforward_layernorm is None:
            x, residual = self.post_attention_layernorm.forward_add(self.self_attn(x, cos, sin), residual)
            return self.mlp(x), residual
        a = self.post_attention_layernorm(self.self_attn(x, cos, sin))
        x, residual = self.pre_feedforward_layernorm.forward_add(a, residual)
        return self.post_feedforward_layernorm(self.mlp(x)), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, linear: LinearFactory):
        super().__init__()
        self.embed_tokens = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size), _freeze=True
        )
        # Gemma: embeddings times sqrt(hidden), the factor rounded to the model dtype first (as transformers does)
        self.register_buffer(
            "embed_scale", torch.tensor(cfg.hidden_size**0.5, dtype=torch.float32) if cfg.embed_scale else None, False
        )
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i, linear) for i in range(cfg.num_hidden_layers))
        self.norm = norm_class(cfg)(cfg.hidden_size, cfg.rms_norm_eps)
        self.vocab: VocabAdapters | None = None  # embed_tokens / lm_head adapters (`LlamaForCausalLM.enable_vocab`)
        self.rotary = RotaryEmbedding(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling)
        # Gemma 3: sliding layers rotate with their own base (rope_local_theta) and scaling
        self.local_rotary = (
            RotaryEmbedding(cfg.rotary_dim, cfg.rope_local_theta, cfg.rope_local_scaling)
            if any(layer.rope == "local" for layer in self.layers)
            else None
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)  # [T, hidden]
        ctx = get_context()
        if self.vocab is not None:  # embedding LoRA / modules_to_save copies per token's slot, before the scale
            h = self.vocab.embed_rows(h, input_ids, ctx.lora if ctx is not None else None)
        if self.embed_scale is not None:
            h = h * self.embed_scale.to(h.dtype)
        long = ctx.rope_long if ctx is not None else None
        rope = {"global": self.rotary(positions, long)}  # cos, sin: [T, rotary_dim] each, shared by the layers
        if self.local_rotary is not None:
            rope["local"] = self.local_rotary(positions, long)
        residual = None
        for layer in self.layers:
            h, residual = layer(h, residual, *rope[layer.rope])
        return self.norm(h) if residual is None else self.norm.forward_add(h, residual)[0]
