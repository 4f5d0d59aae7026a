"""Adapter and full-copy bytes: the seeds' 32 MiB, ARCHITECTURE.md's 83.9 MB, presets vs transformers."""

from __future__ import annotations

import pytest

from multilora_cli.economics import MODEL_PRESETS, Scenario, compute, model_preset, parse_targets, shape_from_flags
from multilora_cli.models.config import LINEAR_MODULES


def test_llama2_7b_rank16_qkvo_bf16_is_exactly_32_mib():
    rep = compute(Scenario(tenants=100, model="llama-2-7b", rank=16, targets="q_proj,k_proj,v_proj,o_proj"))
    # 32 layers x 4 modules x 16 x (4096 + 4096)
    assert rep.section("adapter")["params"] == 32 * 4 * 16 * (4096 + 4096) == 16_777_216
    assert rep.section("adapter")["bytes"] == 16_777_216 * 2 == 32 * 2**20
    assert [m["params"] for m in rep.modules] == [4_194_304] * 4
    assert sum(m["bytes"] for m in rep.modules) == 32 * 2**20


def test_llama3_8b_rank16_all_projections_is_83_9_mb():
    cfg = model_preset("llama-3-8b")
    shape = shape_from_flags(cfg, 16, parse_targets("all"))
    per_layer = sum(m.params_per_layer for m in shape.modules)
    # q 16*(4096+4096), k,v 16*(4096+1024), o 16*(4096+4096), gate,up 16*(4096+14336), down 16*(14336+4096)
    assert per_layer == 16 * (2 * 8192 + 2 * 5120 + 3 * 18432) == 1_310_720
    assert shape.params == 41_943_040
    rep = compute(Scenario(tenants=10, model="llama-3-8b", rank=16, targets="all"))
    assert rep.section("adapter")["bytes"] == 83_886_080  # 83.9 MB
    assert "83.9 MB" in rep.section("adapter").figures[1].shown


@pytest.mark.parametrize(
    "name,published",
    [
        ("llama-2-7b", 6_738_415_616),
        ("llama-3-8b", 8_030_261_248),
        ("llama-3.1-8b", 8_030_261_248),
        ("llama-3.2-1b", 1_235_814_400),
        ("mistral-7b", 7_241_732_096),
        ("qwen2.5-7b", 7_615_616_512),
        ("llama-3-70b", 70_553_706_496),
        ("qwen3-30b-a3b", 30_532_122_624),
    ],
)
def test_preset_parameter_counts_match_published_checkpoints(name, published):
    assert model_preset(name).num_params() == published


def test_presets_match_transformers_parameter_count():
    """Instantiate each preset with transformers on the meta device: same parameter count as ours."""
    import torch
    import transformers as tf

    for name, raw in MODEL_PRESETS.items():
        if name == "llama-3-70b":
            continue  # same code path as llama-3-8b; meta init of 80 layers only costs time
        cls = {
            "llama": tf.LlamaConfig,
            "mistral": tf.MistralConfig,
            "qwen2": tf.Qwen2Config,
            "gemma2": tf.Gemma2Config,
            "gemma3_text": tf.Gemma3TextConfig,
            "phi3": tf.Phi3Config,
            "qwen3_moe": tf.Qwen3MoeConfig,
        }[raw["model_type"]]
        cfg = cls(**{k: v for k, v in raw.items() if not k.startswith("_") and k != "model_type"})
        with torch.device("meta"):
            model = tf.AutoModelForCausalLM.from_config(cfg)
        assert sum(p.numel() for p in model.parameters()) == model_preset(name).num_params(), name


def test_shrink_factor_and_copy_bytes_by_hand():
    for dtype, nbytes in (("bfloat16", 2), ("float32", 4)):
        rep = compute(Scenario(tenants=1, model="llama-2-7b", rank=8, targets="q_proj,v_proj", dtype=dtype))
        adapter = 32 * 2 * 8 * (4096 + 4096) * nbytes
        copy = 6_738_415_616 * nbytes
        assert rep.section("adapter")["bytes"] == adapter
        assert rep.section("full_copy")["copy_bytes"] == copy
        assert rep.section("full_copy")["shrink_factor"] == pytest.approx(copy / adapter)
        assert rep.section("full_copy")["shrink_factor"] == pytest.approx(6_738_415_616 / (32 * 2 * 8 * 8192))


def test_targets_parsing():
    assert parse_targets(None) == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert parse_targets("all") == LINEAR_MODULES == parse_targets("all-linear")
    assert parse_targets("v_proj, q_proj,mlp") == ("q_proj", "v_proj", "gate_proj", "up_proj", "down_proj")


def test_gqa_kv_projection_shapes_follow_the_config():
    cfg = model_preset("qwen2.5-7b")  # hidden 3584, 4 kv heads x 128
    shape = shape_from_flags(cfg, 4, ("k_proj",))
    assert shape.params == 28 * 4 * (3584 + 512)
    small = model_preset("llama-3.2-1b")  # head_dim 64 given explicitly
    assert small.linear_shape("q_proj") == (2048, 2048) and small.linear_shape("k_proj") == (2048, 512)
