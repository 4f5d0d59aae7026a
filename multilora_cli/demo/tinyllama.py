"""A compact, training-only Llama forward over a flat dict of Hugging Face-named tensors.

It exists so the demo can train its base model and adapters with plain torch (transformers and peft are
test-only dependencies). It is the standard Llama computation (RMSNorm, RoPE with rotate_half, GQA, SwiGLU),
so the weights it trains load unchanged in transformers; tests/demo/test_demo.py checks the logits agree.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# LoRA for one module: (A: [r, in], B: [out, r], scaling)
LoraParams = dict[str, tuple[torch.Tensor, torch.Tensor, float]]


def init_weights(cfg: dict, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random float32 weights with HF names for the Llama config dict `cfg` (std 0.02, norms at 1)."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, h)}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            }
        )
    shapes.update({"model.norm.weight": (h,), "lm_head.weight": (v, h)})
    return {
        name: torch.ones(s) if len(s) == 1 else torch.randn(s, generator=generator) * 0.02 for name, s in shapes.items()
    }


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, heads, T, D]; HF convention: rotate the two halves of the head dim.
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def forward(w: dict[str, torch.Tensor], cfg: dict, ids: torch.Tensor, lora: LoraParams | None = None) -> torch.Tensor:
    """Logits [B, T, vocab] for token ids [B, T]. `lora` maps a module name (model.layers.N.self_attn.q_proj)
    to (A, B, scaling): y = x Wᵀ + scaling · (x Aᵀ) Bᵀ."""
    lora = lora or {}
    b, t = ids.shape
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]

    def lin(x: torch.Tensor, name: str) -> torch.Tensor:
        y = x @ w[name + ".weight"].T
        if name in lora:
            a, bm, scaling = lora[name]
            y = y + scaling * ((x @ a.T) @ bm.T)
        return y

    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq)  # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # [T, D]

    x = w["model.embed_tokens.weight"][ids]  # [B, T, H]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = lin(h, p + "self_attn.q_proj").view(b, t, nh, hd).transpose(1, 2)  # [B, nh, T, D]
        k = lin(h, p + "self_attn.k_proj").view(b, t, nkv, hd).transpose(1, 2)  # [B, nkv, T, D]
        v = lin(h, p + "self_attn.v_proj").view(b, t, nkv, hd).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(hd))
        x = x + lin(a.transpose(1, 2).reshape(b, t, nh * hd), p + "self_attn.o_proj")
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + lin(F.silu(lin(h, p + "mlp.gate_proj")) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    x = _rms(x, w["model.norm.weight"], eps)
    return x @ w["lm_head.weight"].T
