"""load_format="dummy": a model from config.json alone, random but deterministic weights, runs in the engine."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.bench.model_dir import write_model_dir
from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from multilora_cli.errors import ConfigError, ModelError
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.loader import load_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_model_dir("tiny", tmp_path_factory.mktemp("tiny"))


def test_dummy_weights_deterministic_finite(tiny_dir):
    cfg = ModelConfig.from_dir(tiny_dir)
    assert not list(tiny_dir.glob("*.safetensors"))  # nothing to read: the dummy path never looks for weights
    a = load_model(tiny_dir, cfg, dtype=torch.float32, load_format="dummy", seed=3)
    b = load_model(tiny_dir, cfg, dtype=torch.float32, load_format="dummy", seed=3)
    c = load_model(tiny_dir, cfg, dtype=torch.float32, load_format="dummy", seed=4)
    pa, pb, pc = dict(a.named_parameters()), dict(b.named_parameters()), dict(c.named_parameters())
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    assert any(not torch.equal(pa[n], pc[n]) for n in pa)
    for name, p in pa.items():
        assert torch.isfinite(p).all(), name
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p))
        elif p.dim() >= 2:
            assert 0.01 < p.std().item() < 0.04, name
    with pytest.raises(ModelError, match="no model.safetensors"):
        load_model(tiny_dir, cfg, dtype=torch.float32)  # "auto" still insists on a checkpoint


def test_load_format_validated():
    with pytest.raises(ConfigError, match="load_format"):
        EngineConfig(model="x", load_format="npz")


def test_engine_runs_dummy_model(tiny_dir):
    engine = Engine(EngineConfig(model=str(tiny_dir), load_format="dummy", num_kv_blocks=64))
    sp = SamplingParams(max_tokens=5, ignore_eos=True)
    out = engine.generate_all(
        [Request(key=i, id=str(i), prompt_token_ids=[5 + i, 9, 11], sampling=sp) for i in range(3)]
    )
    assert [r.error for r in out] == [None] * 3
    assert all(len(r.token_ids) == 5 and all(0 <= t < 512 for t in r.token_ids) for r in out)
    again = Engine(EngineConfig(model=str(tiny_dir), load_format="dummy", num_kv_blocks=64)).generate_all(
        [Request(key=0, id="0", prompt_token_ids=[5, 9, 11], sampling=sp)]
    )
    assert again[0].token_ids == out[0].token_ids  # same seed, same weights, same text
