"""Phi-3 adapters: PEFT's LoRA on the fused qkv_proj / gate_up_proj, split into the packed slices (one lora_A
shared by the slices, lora_B cut into their rows); `inspect` shows them as the checkpoint holds them; an adapter
of the other naming is refused on either base."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from multilora_cli.adapters.peft import load_adapter
from multilora_cli.errors import AdapterError
from multilora_cli.models.config import ModelConfig


@pytest.fixture(scope="module")
def phi3_base(zoo):
    return zoo.base("phi3", "phi3")


@pytest.fixture(scope="module")
def phi3_adapter(zoo, phi3_base):
    """qkv_proj at rank 8, gate_up_proj at rank 4 (rank_pattern), rsLoRA, layer 1 only."""
    return zoo.adapter(
        "phi3-fused",
        phi3_base,
        r=8,
        alpha=16,
        targets=("qkv_proj", "gate_up_proj"),
        rank_pattern={"gate_up_proj": 4},
        use_rslora=True,
        layers_to_transform=[1],
    )


def test_fused_modules_split_into_slices(phi3_base, phi3_adapter):
    cfg = ModelConfig.from_dir(phi3_base)
    ad = load_adapter(phi3_adapter, "p", cfg)
    st = {
        k.replace("base_model.model.", ""): t for k, t in load_file(phi3_adapter / "adapter_model.safetensors").items()
    }
    assert sorted(ad.modules) == [(1, n) for n in ("gate_proj", "k_proj", "q_proj", "up_proj", "v_proj")]
    lo = 0
    for name, rows in (("q_proj", cfg.q_size), ("k_proj", cfg.kv_size), ("v_proj", cfg.kv_size)):
        m = ad.modules[(1, name)]
        assert torch.equal(m.a, st["model.layers.1.self_attn.qkv_proj.lora_A.weight"])
        assert torch.equal(m.b, st["model.layers.1.self_attn.qkv_proj.lora_B.weight"][lo : lo + rows])
        assert m.scaling == 16 / 8**0.5 and ad.module_names[(1, name)] == "model.layers.1.self_attn.qkv_proj"
        lo += rows
    up = ad.modules[(1, "up_proj")]
    assert up.rank == 4 and up.scaling == 16 / 2  # rank_pattern 4, rsLoRA: alpha / sqrt(4)
    assert torch.equal(up.b, st["model.layers.1.mlp.gate_up_proj.lora_B.weight"][cfg.intermediate_size :])
    assert [n is None for n in (s for s in ad.slices_for(1, "qkv_proj"))] == [False, False, False]


def test_inspect_shows_the_checkpoint_modules(cli, phi3_base, phi3_adapter):
    rc, out, err = cli("inspect", phi3_adapter, "--model", phi3_base, "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["servable"] is True, err
    assert rep["modules_adapted"] == ["qkv_proj", "gate_up_proj"]
    rows = [(m["module"], m["layers"], m["rank"], m["in_features"], m["out_features"]) for m in rep["modules"]]
    assert rows == [("qkv_proj", [1], 8, 64, 64 + 2 * 32), ("gate_up_proj", [1], 4, 64, 2 * 96)]
    want = 8 * (64 + 128) + 4 * (64 + 192)  # one lora_A and the whole lora_B of each module, as stored
    assert rep["num_params"] == want and rep["bytes"] == 4 * want


def test_an_adapter_of_the_other_naming_is_refused(zoo, phi3_base, phi3_adapter, llama_base, good_adapter):
    with pytest.raises(
        AdapterError, match=r"gate_up_proj is a gate_up_proj, which the base.s layers do not have \(its llama"
    ):
        load_adapter(phi3_adapter, "p", ModelConfig.from_dir(llama_base))
    with pytest.raises(AdapterError, match=r"is a q_proj, which the base's layers do not have \(its phi3 layers"):
        load_adapter(good_adapter, "g", ModelConfig.from_dir(phi3_base))
