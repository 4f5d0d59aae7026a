"""Loader: every architecture loads into the fused layout; sharded checkpoints; clear errors; dtype choice."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from multilora_cli.errors import ModelError
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.loader import load_model, resolve_dtype
from tests.builders import ARCHS


@pytest.mark.parametrize("arch", ARCHS)
def test_loads_every_arch_into_fused_params(base_path, arch):
    path = base_path(arch)
    cfg = ModelConfig.from_dir(path)
    model = load_model(path, cfg, dtype=torch.float32, device="cpu")
    hf = load_file(path / "model.safetensors")
    layer = model.model.layers[1]
    if cfg.fused_checkpoint:  # Phi-3: the checkpoint's own fused tensors, q|k|v and gate|up as ours
        assert torch.equal(layer.self_attn.qkv_proj.weight, hf["model.layers.1.self_attn.qkv_proj.weight"])
        assert torch.equal(layer.mlp.gate_up_proj.weight, hf["model.layers.1.mlp.gate_up_proj.weight"])
    else:
        q, k, v = layer.self_attn.qkv_proj.weight.split([cfg.q_size, cfg.kv_size, cfg.kv_size])
        assert torch.equal(q, hf["model.layers.1.self_attn.q_proj.weight"])
        assert torch.equal(k, hf["model.layers.1.self_attn.k_proj.weight"])
        assert torch.equal(v, hf["model.layers.1.self_attn.v_proj.weight"])
        gate, up = layer.mlp.gate_up_proj.weight.split(cfg.intermediate_size)
        assert torch.equal(gate, hf["model.layers.1.mlp.gate_proj.weight"])
        assert torch.equal(up, hf["model.layers.1.mlp.up_proj.weight"])
    if cfg.sandwich_norms:
        assert torch.equal(
            layer.pre_feedforward_layernorm.weight, hf["model.layers.1.pre_feedforward_layernorm.weight"]
        )
    if cfg.attention_bias:
        assert torch.equal(
            layer.self_attn.qkv_proj.bias[cfg.q_size : cfg.q_size + cfg.kv_size],
            hf["model.layers.1.self_attn.k_proj.bias"],
        )
    if cfg.qk_norm:
        assert torch.equal(layer.self_attn.k_norm.weight, hf["model.layers.1.self_attn.k_norm.weight"])
    if cfg.tie_word_embeddings:
        assert "lm_head.weight" not in hf
        assert model.lm_head.weight is model.model.embed_tokens.weight
    else:
        assert torch.equal(model.lm_head.weight, hf["lm_head.weight"])
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()


def test_sharded_checkpoint_and_dtype(base_path, tmp_path):
    import transformers as tf

    hf = tf.AutoModelForCausalLM.from_pretrained(base_path("qwen2"), dtype=torch.float32)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    cfg = ModelConfig.from_dir(tmp_path)
    model = load_model(tmp_path, cfg, dtype=torch.bfloat16, device="cpu", max_loras=2, max_lora_rank=8)
    assert model.dtype == torch.bfloat16
    assert all(m.lora.a.dtype == torch.bfloat16 for m in model.lora_modules().values())
    ref = hf.model.layers[0].self_attn.v_proj.bias.to(torch.bfloat16)
    assert torch.equal(model.model.layers[0].self_attn.qkv_proj.bias[-cfg.kv_size :], ref)


def _rewrite(src, dst, edit) -> None:
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    dst.mkdir()
    save_file(tensors, dst / "model.safetensors")
    (dst / "config.json").write_text((src / "config.json").read_text())


def test_missing_tensor_is_named(base_path, tmp_path):
    src = base_path("llama")
    _rewrite(src, tmp_path / "m", lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(ModelError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight"):
        load_model(tmp_path / "m", ModelConfig.from_dir(src), dtype=torch.float32)


def test_mismatched_tensor_names_tensor_and_file(base_path, tmp_path):
    src = base_path("llama")

    def shrink(t):
        t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"][:-1]

    _rewrite(src, tmp_path / "m", shrink)
    with pytest.raises(ModelError, match=r"model\.safetensors.*up_proj\.weight has shape \(95, 64\)"):
        load_model(tmp_path / "m", ModelConfig.from_dir(src), dtype=torch.float32)


@pytest.mark.parametrize("keep", [0, 5, 1000, -100])
def test_truncated_checkpoint_is_a_model_error_naming_the_file(base_path, tmp_path, keep):
    src = base_path("llama")
    dst = tmp_path / "m"
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    data = (src / "model.safetensors").read_bytes()
    (dst / "model.safetensors").write_bytes(data[:keep] if keep >= 0 else data[:keep])  # -100: header intact
    with pytest.raises(ModelError, match=r"m/model\.safetensors: not a readable safetensors file") as e:
        load_model(dst, ModelConfig.from_dir(src), dtype=torch.float32)
    assert "download the model again" in e.value.hint


def test_no_weights_is_a_model_error(tmp_path, base_path):
    with pytest.raises(ModelError, match="no model.safetensors"):
        load_model(tmp_path, ModelConfig.from_dir(base_path("llama")), dtype=torch.float32)


def test_resolve_dtype():
    assert resolve_dtype("bfloat16", "auto", "cpu") == torch.float32
    assert resolve_dtype(None, "float16", "cpu") == torch.float16
    assert resolve_dtype("float32", "bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(ModelError, match="unknown dtype"):
        resolve_dtype(None, "int8", "cpu")
