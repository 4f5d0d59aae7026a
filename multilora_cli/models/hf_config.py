"""A Hugging Face `config.json` dict -> the keyword fields of `ModelConfig`, family by family.

Each family reads its own fields with transformers' own defaults for keys a config leaves out (the config
classes' defaults in transformers 5.x: `Gemma2Config`, `Gemma3TextConfig`, `Phi3Config`), so a hand-written
config means what it means to transformers. The Llama family (llama, mistral, qwen2, qwen3) keeps the reading it
always had. Raises KeyError for a missing required key (the caller words it), UnsupportedModelError for a setting
multilora does not serve.
"""

from __future__ import annotations

import math

from multilora_cli.errors import ModelError, UnsupportedModelError

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
GEMMA_FAMILY = ("gemma2", "gemma3_text")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")

# transformers' config-class defaults of the Gemma families (used where a config.json omits the key)
_GEMMA_DEFAULTS = {
    "gemma2": dict(
        head_dim=256,
        num_key_value_heads=4,
        max_position_embeddings=8192,
        query_pre_attn_scalar=256,
        sliding_window=4096,
        final_logit_softcapping=30.0,
        attn_logit_softcapping=50.0,
        pattern=2,
    ),
    "gemma3_text": dict(
        head_dim=256,
        num_key_value_heads=4,
        max_position_embeddings=131072,
        query_pre_attn_scalar=256,
        sliding_window=4096,
        final_logit_softcapping=None,
        attn_logit_softcapping=None,  # read by Gemma3Attention but never applied: transformers ignores it too
        pattern=6,
    ),
}


def common_fields(cfg: dict, heads: int, hidden: int) -> dict:
    """The fields every family reads the same way."""
    eos = cfg.get("eos_token_id")
    return dict(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        num_attention_heads=heads,
        torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=[int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else [])],
    )


def scaling_of(rope: dict | None, where: str, allowed: tuple[str, ...]) -> dict | None:
    """A rope-scaling dict normalised to {"rope_type": ..., ...} (None for default rope); a type outside `allowed`
    is refused."""
    if not rope:
        return None
    scaling = dict(rope)
    scaling["rope_type"] = scaling.get("rope_type") or scaling.get("type")
    if scaling["rope_type"] in (None, "default"):
        return None
    if scaling["rope_type"] not in allowed:
        raise UnsupportedModelError(
            f"{where}: rope scaling {scaling['rope_type']!r} is not supported", hint=f"supported: {', '.join(allowed)}"
        )
    return scaling


def llama_fields(mt: str, cfg: dict, where: str) -> dict:
    """Llama 2/3/3.1, Mistral, Qwen2, Qwen3: the reading multilora always had."""
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    rope = cfg.get("rope_parameters") or {}
    rope_theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    scaling = scaling_of(
        cfg.get("rope_scaling") or (rope if rope.get("rope_type") not in (None, "default") else None),
        where,
        ("llama3", "linear"),
    )
    bias = bool(cfg.get("attention_bias", mt == "qwen2"))
    return dict(
        common_fields(cfg, heads, hidden),
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bias,
        o_bias=bias and mt == "llama",
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=mt == "qwen3",
        sliding_window=cfg.get("sliding_window") if cfg.get("use_sliding_window", mt == "mistral") else None,
        layer_types=cfg.get("layer_types"),
    )


def gemma_fields(mt: str, cfg: dict, where: str) -> dict:
    """Gemma 2 and Gemma 3 (text): (1 + w) RMSNorms in float32, norms before and after attention and MLP, embeddings
    times sqrt(hidden), GeGLU, attention scale query_pre_attn_scalar ** -0.5, soft-capping (Gemma 2), sliding
    window on the layers `layer_types` names (default: every second layer for Gemma 2, five of six for Gemma 3),
    q/k norms and a separate RoPE base for the sliding layers (Gemma 3)."""
    d = _GEMMA_DEFAULTS[mt]
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedModelError(
            f"{where}: use_bidirectional_attention=true (a non-causal encoder) is not supported",
            hint="multilora serves causal language models",
        )
    act = cfg.get("hidden_activation") or "gelu_pytorch_tanh"
    layer_types = cfg.get("layer_types")
    if layer_types is None:  # transformers' default pattern: every `pattern`-th layer (1-based) is global
        pattern = d["pattern"]
        if mt == "gemma3_text":  # Gemma3TextConfig's older int field; Gemma 2 has none
            pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or pattern)
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    window = cfg.get("sliding_window", d["sliding_window"])
    bias = bool(cfg.get("attention_bias", False))
    out = dict(
        common_fields(cfg, heads, hidden),
        num_key_value_heads=int(cfg.get("num_key_value_heads") or d["num_key_value_heads"]),
        head_dim=int(cfg.get("head_dim") or d["head_dim"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", d["max_position_embeddings"])),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        attention_bias=bias,
        o_bias=bias,
        sliding_window=int(window) if window else None,
        layer_types=list(layer_types),
        hidden_act=act,
        norm_offset=True,
        sandwich_norms=True,
        embed_scale=True,
        query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", d["query_pre_attn_scalar"])),
        final_softcap=_cap(cfg.get("final_logit_softcapping", d["final_logit_softcapping"])),
    )
    if mt == "gemma2":
        rope = cfg.get("rope_parameters") or {}
        out["rope_theta"] = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        out["rope_scaling"] = scaling_of(cfg.get("rope_scaling") or rope, where, ("linear",))
        out["attn_softcap"] = _cap(cfg.get("attn_logit_softcapping", d["attn_logit_softcapping"]))
        return out
    # Gemma 3: full-attention layers rope_theta (+ rope scaling), sliding layers rope_local_base_freq, unscaled;
    # transformers 5 writes both as rope_parameters {"full_attention": {...}, "sliding_attention": {...}}
    rope = cfg.get("rope_parameters") or {}
    nested = "full_attention" in rope or "sliding_attention" in rope
    full = dict(rope.get("full_attention") or {}) if nested else dict(cfg.get("rope_scaling") or {})
    local = dict(rope.get("sliding_attention") or {}) if nested else {}
    out["rope_theta"] = float(full.get("rope_theta") or cfg.get("rope_theta") or 1_000_000.0)
    out["rope_scaling"] = scaling_of(full, where, ("linear",))
    out["rope_local_theta"] = float(local.get("rope_theta") or cfg.get("rope_local_base_freq") or 10_000.0)
    out["rope_local_scaling"] = scaling_of(local, where, ("linear",))
    out["qk_norm"] = True
    return out


def phi3_fields(cfg: dict, where: str) -> dict:
    """Phi-3 / Phi-3.5 / Phi-4 (dense): fused qkv_proj and gate_up_proj in the checkpoint, the config's sliding
    window on every layer, LongRoPE (`longrope`, older names `su` and `yarn`, as Phi3Config renames them) with
    short and long factors, partial rotary (Phi-4-mini)."""
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    act = cfg.get("hidden_act") or "silu"
    if act != "silu":
        raise UnsupportedModelError(f"{where}: hidden_act {act!r} is not supported for phi3", hint="served: silu")
    max_pos = int(cfg.get("max_position_embeddings", 4096))
    rope = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    theta = float(rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0)
    partial = float(rope.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0)
    kind = rope.get("rope_type") or rope.get("type") or "default"
    kind = "longrope" if kind in ("su", "yarn") else kind
    if kind not in ("default", "longrope"):
        raise UnsupportedModelError(f"{where}: rope scaling {kind!r} is not supported", hint="supported: longrope")
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    scaling = None
    if kind == "longrope":
        scaling = longrope_scaling(rope, cfg, max_pos, int(head_dim * partial) // 2, where)
    window = cfg.get("sliding_window")
    return dict(
        common_fields(cfg, heads, hidden),
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=int(window) if window else None,
        partial_rotary_factor=partial,
        fused_checkpoint=True,
    )


def longrope_scaling(rope: dict, cfg: dict, max_pos: int, n_freq: int, where: str) -> dict:
    """transformers' `_compute_longrope_parameters` inputs, resolved: short / long factors (n_freq each), the
    pretraining length (Phi3Config's own `original_max_position_embeddings` wins over the rope dict's, default
    4096) and the attention factor multiplying cos and sin (given, else sqrt(1 + ln(factor) / ln(original)) with
    factor = given, else max_position_embeddings / original; 1 when factor <= 1)."""
    try:
        short = [float(x) for x in rope["short_factor"]]
        long = [float(x) for x in rope["long_factor"]]
    except KeyError as e:
        raise ModelError(f"{where}: longrope rope scaling lacks {e.args[0]!r}") from None
    if len(short) != n_freq or len(long) != n_freq:
        raise ModelError(
            f"{where}: longrope short_factor / long_factor have {len(short)} / {len(long)} values; the rotary "
            f"dimension needs {n_freq}"
        )
    original = int(cfg.get("original_max_position_embeddings", 4096))
    factor = rope.get("factor")
    factor = float(factor) if factor is not None else max_pos / original
    attention = rope.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {
        "rope_type": "longrope",
        "short_factor": short,
        "long_factor": long,
        "original_max_position_embeddings": original,
        "attention_factor": float(attention),
    }


def _cap(value) -> float | None:
    return float(value) if value else None
