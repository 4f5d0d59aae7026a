"""config.json of the Gemma and Phi-3 families read as transformers reads it: v4 layouts (rope_scaling "su",
rope_local_base_freq, sliding_window_pattern), transformers' defaults for absent keys, and clear refusals."""

from __future__ import annotations

import math

import pytest

from multilora_cli.errors import ModelError, UnsupportedModelError
from multilora_cli.models.config import ModelConfig

SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=12, num_attention_heads=4)


def test_gemma2_defaults_are_transformers():
    cfg = ModelConfig.from_dict({"model_type": "gemma2", **SHAPE})
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.tie_word_embeddings) == (256, 4, True)
    assert (cfg.attn_softcap, cfg.final_softcap, cfg.query_pre_attn_scalar) == (50.0, 30.0, 256.0)
    assert cfg.attn_scale == 256**-0.5 and cfg.sliding_window == 4096 and cfg.hidden_act == "gelu_pytorch_tanh"
    assert [cfg.layer_sliding_window(i) for i in range(3)] == [4096, None, 4096]  # even layers slide
    assert cfg.norm_offset and cfg.sandwich_norms and cfg.embed_scale and not cfg.qk_norm
    assert cfg.rope_local_theta is None and {cfg.layer_rope(i) for i in range(12)} == {"global"}


def test_gemma3_v4_layout():
    """A transformers-4 Gemma 3 config: rope_theta (global, with rope_scaling) and rope_local_base_freq, every
    sliding_window_pattern-th layer global."""
    cfg = ModelConfig.from_dict(
        {
            "model_type": "gemma3_text",
            **SHAPE,
            "rope_theta": 1_000_000,
            "rope_local_base_freq": 10_000,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "sliding_window": 512,
            "sliding_window_pattern": 6,
        }
    )
    assert [cfg.layer_rope(i) for i in range(7)] == ["local"] * 5 + ["global", "local"]
    assert [cfg.layer_sliding_window(i) for i in (4, 5, 11)] == [512, None, None]
    assert cfg.rope_theta == 1e6 and cfg.rope_local_theta == 1e4 and cfg.rope_scaling["factor"] == 8.0
    assert cfg.rope_local_scaling is None and cfg.qk_norm and cfg.attn_softcap is None and cfg.final_softcap is None


def test_gemma3_multimodal_and_bidirectional_are_refused():
    with pytest.raises(UnsupportedModelError, match="multimodal Gemma 3 checkpoints"):
        ModelConfig.from_dict({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", **SHAPE}})
    with pytest.raises(UnsupportedModelError, match="use_bidirectional_attention"):
        ModelConfig.from_dict({"model_type": "gemma3_text", **SHAPE, "use_bidirectional_attention": True})


def test_phi3_v4_su_rope_and_its_attention_factor():
    """Phi-3-mini-128k's layout: rope_scaling type "su", original_max_position_embeddings at the top level (it wins,
    as in Phi3Config), attention factor sqrt(1 + ln(max / original) / ln(original))."""
    n = 8  # head_dim 16 / 2
    cfg = ModelConfig.from_dict(
        {
            "model_type": "phi3",
            **SHAPE,
            "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096,
            "rope_scaling": {"type": "su", "short_factor": [1.0] * n, "long_factor": [2.0] * n},
            "sliding_window": 262144,
        }
    )
    sc = cfg.rope_scaling
    assert sc["rope_type"] == "longrope" and sc["original_max_position_embeddings"] == 4096
    assert sc["attention_factor"] == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert cfg.fused_checkpoint and cfg.peft_modules == ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    assert cfg.linear_shape("qkv_proj") == (64, 3 * 64) and cfg.rms_norm_eps == 1e-5


def test_phi3_refusals():
    with pytest.raises(UnsupportedModelError, match="hidden_act 'gelu'"):
        ModelConfig.from_dict({"model_type": "phi3", **SHAPE, "hidden_act": "gelu"})
    with pytest.raises(UnsupportedModelError, match="rope scaling 'dynamic'"):
        ModelConfig.from_dict({"model_type": "phi3", **SHAPE, "rope_scaling": {"type": "dynamic", "factor": 2.0}})
    with pytest.raises(ModelError, match="the rotary dimension needs 8"):
        ModelConfig.from_dict(
            {
                "model_type": "phi3",
                **SHAPE,
                "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]},
            }
        )
