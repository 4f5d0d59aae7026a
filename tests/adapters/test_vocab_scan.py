"""adapters/vocab.py: which embed_tokens / lm_head keys are served, and the checkpoints refused from the header
(a resized vocabulary, a copy the config does not name, LoRA and a copy on one module)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from multilora_cli.adapters.peft import load_adapter
from multilora_cli.adapters.vocab import vocab_key
from multilora_cli.errors import AdapterError
from multilora_cli.models.config import ModelConfig
from tests.builders import build_adapter, build_base


@pytest.mark.parametrize(
    "key, want",
    [
        ("base_model.model.model.embed_tokens.lora_embedding_A", ("model.embed_tokens", "embed_tokens", "A")),
        ("base_model.model.model.embed_tokens.lora_embedding_B", ("model.embed_tokens", "embed_tokens", "B")),
        ("base_model.model.lm_head.lora_A.weight", ("lm_head", "lm_head", "A")),
        ("base_model.model.lm_head.lora_B.default.weight", ("lm_head", "lm_head", "B")),
        ("base_model.model.lm_head.weight", ("lm_head", "lm_head", "full")),
        ("base_model.model.model.embed_tokens.weight", ("model.embed_tokens", "embed_tokens", "full")),
        ("base_model.model.lm_head.base_layer.weight", ("lm_head", "lm_head", "base")),
        ("base_model.model.lm_head.lora_embedding_A", None),  # an embedding LoRA on the head: not PEFT's
        ("base_model.model.lm_head.lora_magnitude_vector", None),  # DoRA on the head: refused by name
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", None),
    ],
)
def test_vocab_keys(key, want):
    assert vocab_key(key) == want


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab_scan")
    base = build_base(root / "base", "llama")
    head = build_adapter(base, root / "head", targets=("lm_head", "q_proj"), seed=3)
    mts = build_adapter(base, root / "mts", targets=("q_proj",), modules_to_save=["lm_head"], seed=4)
    return root, ModelConfig.from_dir(base), head, mts


def _edit(src, dst, tensors=None, config=None):
    shutil.copytree(src, dst)
    if tensors is not None:
        t = load_file(dst / "adapter_model.safetensors")
        save_file(tensors(t), dst / "adapter_model.safetensors")
    if config is not None:
        c = json.loads((dst / "adapter_config.json").read_text())
        config(c)
        (dst / "adapter_config.json").write_text(json.dumps(c))
    return dst


def test_loads_with_the_base_shapes(made):
    _, cfg, head, mts = made
    a = load_adapter(head, "head", cfg)
    assert a.vocab.head.a.shape == (8, cfg.hidden_size) and a.vocab.head.b.shape == (cfg.vocab_size, 8)
    assert a.vocab.head.scaling == 2.0 and a.vocab.base_copies["lm_head"]().shape == (cfg.vocab_size, cfg.hidden_size)
    b = load_adapter(mts, "mts", cfg)
    assert b.vocab.head_full.shape == (cfg.vocab_size, cfg.hidden_size) and b.vocab.embed is None
    assert b.num_params == sum(m.a.numel() + m.b.numel() for m in b.modules.values()) + b.vocab.head_full.numel()


def test_resized_vocabulary_is_refused(made):
    root, cfg, head, _ = made

    def shrink(t):
        k = "base_model.model.lm_head.lora_B.weight"
        return {**t, k: t[k][:200].contiguous()}

    bad = _edit(head, root / "resized", tensors=shrink)
    with pytest.raises(AdapterError, match="LoRA maps 64 -> 200 features, the base's lm_head 64 -> 256") as e:
        load_adapter(bad, "resized", cfg)
    assert "resized vocabularies" in e.value.hint


def test_copy_the_config_does_not_name_is_refused(made):
    root, cfg, _, mts = made
    bad = _edit(mts, root / "unnamed", config=lambda c: c.update(modules_to_save=None))
    with pytest.raises(AdapterError, match="modules_to_save does not name it"):
        load_adapter(bad, "unnamed", cfg)


def test_lora_and_copy_on_one_module_are_refused(made):
    root, cfg, head, mts = made
    copy = load_file(mts / "adapter_model.safetensors")["base_model.model.lm_head.weight"]
    bad = _edit(
        head,
        root / "both",
        tensors=lambda t: {**t, "base_model.model.lm_head.weight": copy},
        config=lambda c: c.update(modules_to_save=["lm_head"]),
    )
    with pytest.raises(AdapterError, match="both LoRA tensors and a modules_to_save copy"):
        load_adapter(bad, "both", cfg)


def test_nan_in_a_copy_is_refused(made):
    root, cfg, _, mts = made

    def poison(t):
        k = "base_model.model.lm_head.weight"
        w = t[k].clone()
        w[3, 4] = float("nan")
        return {**t, k: w}

    bad = _edit(mts, root / "nan", tensors=poison)
    with pytest.raises(AdapterError, match="NaN or Inf"):
        load_adapter(bad, "nan", cfg)
    assert torch.isnan(load_file(bad / "adapter_model.safetensors")["base_model.model.lm_head.weight"]).any()


def test_a_copy_past_float16s_range_is_refused_in_float16(made):
    """A modules_to_save copy holding a finite value float16 cannot (1e5) would be served as Inf in float16:
    refused then, naming the tensor; served in bfloat16."""
    root, cfg, _, mts = made

    def big(t):
        k = "base_model.model.lm_head.weight"
        w = t[k].clone()
        w[3, 4] = 1e5
        return {**t, k: w}

    bad = _edit(mts, root / "big", tensors=big)
    with pytest.raises(AdapterError, match=r"lm_head.weight holds values beyond float16's range"):
        load_adapter(bad, "big", cfg, dtype=torch.float16)
    assert load_adapter(bad, "big", cfg, dtype=torch.bfloat16).vocab.head_full.dtype == torch.bfloat16


def test_dora_on_the_head_is_refused_by_name(made):
    from multilora_cli.adapters.tensors import classify_key

    assert "DoRA on embed_tokens / lm_head" in classify_key("base_model.model.lm_head.lora_magnitude_vector")


def test_slot_bytes_of_a_run(made):
    """What `multilora run`'s default --max-loras adds per slot for a run's vocab adapters (run/setup.py)."""
    from multilora_cli.adapters.costs import full_copy_bytes, vocab_lora_slot_bytes, vocab_slot_bytes
    from multilora_cli.adapters.scan import scan_adapter

    _, cfg, head, mts = made
    scans = [scan_adapter(p, p.name, cfg).vocab for p in (head, mts)]
    v, h = cfg.vocab_size, cfg.hidden_size
    assert vocab_lora_slot_bytes(cfg, "lm_head", 16) == 2 * 16 * (v + h)
    assert vocab_slot_bytes(cfg, scans, 16, 2) == 2 * 16 * (v + h) + full_copy_bytes(cfg) == 2 * (16 * (v + h) + v * h)
    assert vocab_slot_bytes(cfg, scans[:1], 16, 2) == vocab_lora_slot_bytes(cfg, "lm_head", 16)
