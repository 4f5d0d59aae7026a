"""Named model shapes and GPU specs the economics arithmetic starts from.

Model presets are the published Hugging Face `config.json` values (the fields a model's shape needs),
parsed through `ModelConfig.from_dict` exactly like a downloaded config, so a preset and the real directory give
the same numbers (Gemma 3 12B: the text model's config, `text_config` of the published multimodal checkpoint). GPU figures are vendor datasheet numbers; prices are stated assumptions, not quotes.
"""

from __future__ import annotations

from dataclasses import dataclass

from multilora_cli.models.config import ModelConfig

HOURS_PER_MONTH = 730  # 8760 h / 12: the usual cloud billing month
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _cfg(
    hf_id: str, model_type: str, hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int, **extra
) -> dict:
    return dict(
        _name_or_path=hf_id,
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
        **extra,
    )


# name -> HF config dict (values from each model's published config.json; the Hub id says which one).
MODEL_PRESETS: dict[str, dict] = {
    "llama-2-7b": _cfg(
        "meta-llama/Llama-2-7b-hf", "llama", 4096, 11008, 32, 32, 32, 32000, max_position_embeddings=4096
    ),
    "llama-3-8b": _cfg(
        "meta-llama/Meta-Llama-3-8B",
        "llama",
        4096,
        14336,
        32,
        32,
        8,
        128256,
        rope_theta=500000.0,
        max_position_embeddings=8192,
    ),
    "llama-3.1-8b": _cfg(
        "meta-llama/Llama-3.1-8B",
        "llama",
        4096,
        14336,
        32,
        32,
        8,
        128256,
        rope_theta=500000.0,
        rope_scaling=_LLAMA3_ROPE,
        max_position_embeddings=131072,
    ),
    "llama-3-70b": _cfg(
        "meta-llama/Meta-Llama-3-70B",
        "llama",
        8192,
        28672,
        80,
        64,
        8,
        128256,
        rope_theta=500000.0,
        max_position_embeddings=8192,
    ),
    "llama-3.2-1b": _cfg(
        "meta-llama/Llama-3.2-1B",
        "llama",
        2048,
        8192,
        16,
        32,
        8,
        128256,
        head_dim=64,
        tie_word_embeddings=True,
        rope_theta=500000.0,
        rope_scaling={**_LLAMA3_ROPE, "factor": 32.0},
        max_position_embeddings=131072,
    ),
    "mistral-7b": _cfg(
        "mistralai/Mistral-7B-v0.1",
        "mistral",
        4096,
        14336,
        32,
        32,
        8,
        32000,
        sliding_window=4096,
        max_position_embeddings=32768,
    ),
    "qwen2.5-7b": _cfg(
        "Qwen/Qwen2.5-7B",
        "qwen2",
        3584,
        18944,
        28,
        28,
        4,
        152064,
        rope_theta=1000000.0,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
    ),
    "gemma-2-9b": _cfg(
        "google/gemma-2-9b",
        "gemma2",
        3584,
        14336,
        42,
        16,
        8,
        256000,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=4096,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh",
        rope_theta=10000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    "gemma-3-12b": _cfg(
        "google/gemma-3-12b-pt",
        "gemma3_text",
        3840,
        15360,
        48,
        16,
        8,
        262208,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=1024,
        sliding_window_pattern=6,
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=131072,
        tie_word_embeddings=True,
    ),
    "phi-3-mini": _cfg(
        "microsoft/Phi-3-mini-4k-instruct",
        "phi3",
        3072,
        8192,
        32,
        32,
        32,
        32064,
        sliding_window=2047,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        original_max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    "phi-4": _cfg(
        "microsoft/phi-4",
        "phi3",
        5120,
        17920,
        40,
        40,
        10,
        100352,
        rope_theta=250000.0,
        max_position_embeddings=16384,
        original_max_position_embeddings=16384,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
    "qwen3-30b-a3b": _cfg(  # mixture of experts: 128 experts of width 768, top-8, on every layer
        "Qwen/Qwen3-30B-A3B",
        "qwen3_moe",
        2048,
        6144,
        48,
        32,
        4,
        151936,
        head_dim=128,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
}


def preset_name(spec: str) -> str | None:
    """The preset `spec` names: a preset name or the Hub id it was taken from (case-insensitive), else None."""
    key = spec.strip().lower()
    if key in MODEL_PRESETS:
        return key
    return next((k for k, c in MODEL_PRESETS.items() if c["_name_or_path"].lower() == key), None)


def model_preset(spec: str) -> ModelConfig | None:
    """The ModelConfig of the preset `spec` names (see `preset_name`), or None."""
    name = preset_name(spec)
    if name is None:
        return None
    cfg = MODEL_PRESETS[name]
    return ModelConfig.from_dict(cfg, name_or_path=cfg["_name_or_path"])


@dataclass(slots=True, frozen=True)
class GpuSpec:
    """One GPU: memory (GB = 1e9 bytes, as datasheets count), HBM bandwidth (TB/s), $/GPU-hour, host link."""

    name: str
    memory_gb: float
    bandwidth_tbs: float
    hour_usd: float
    pcie_gbs: float  # effective host->device copy bandwidth from pinned memory
    pcie_note: str


_GEN5 = (55.0, "PCIe Gen5 x16: 64 GB/s raw, ~55 GB/s effective pinned copies")
_GEN4 = (25.0, "PCIe Gen4 x16: 32 GB/s raw, ~25 GB/s effective pinned copies")

# Prices: assumed typical on-demand $/GPU-hour at large clouds and GPU clouds (mid-2025); they vary 2-3x
# across providers and commitments, so every report prints the one it used and --gpu-hour-usd overrides it.
GPU_PRESETS: dict[str, GpuSpec] = {
    "h100-sxm": GpuSpec("h100-sxm", 80, 3.35, 2.99, *_GEN5),
    "h200": GpuSpec("h200", 141, 4.8, 3.79, *_GEN5),
    "a100-80gb": GpuSpec("a100-80gb", 80, 2.039, 1.79, *_GEN4),
    "a100-40gb": GpuSpec("a100-40gb", 40, 1.555, 1.29, *_GEN4),
    "l40s": GpuSpec("l40s", 48, 0.864, 0.99, *_GEN4),
    "a10g": GpuSpec("a10g", 24, 0.6, 1.01, *_GEN4),
}
