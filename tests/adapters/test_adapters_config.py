"""AdapterConfig against PEFT itself: target matching, layer selection, rank/alpha patterns, scaling."""

from __future__ import annotations

import json
import math

import pytest
from peft import LoraConfig
from peft.tuners.tuners_utils import check_target_module_exists
from peft.utils.other import get_pattern_key

from multilora_cli.adapters.config import AdapterConfig
from multilora_cli.errors import AdapterError

PARENT = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}
NAMES = [f"model.layers.{i}.{p}.{m}" for i in range(12) for m, p in PARENT.items()] + [
    "lm_head",
    "model.embed_tokens",
    "model.layers.3.mlp.experts.1.up_proj",
    "model.norm",
]

PEFT_CONFIGS = [
    dict(target_modules=["q_proj", "v_proj"]),
    dict(target_modules=["self_attn.q_proj", "mlp.down_proj", "model.layers.0.self_attn.o_proj"]),
    dict(target_modules=r".*\.layers\.1\d?\.(self_attn\.(q|k)_proj|mlp\.up_proj)"),
    dict(target_modules=r".*(q|v)_proj"),
    dict(target_modules=["q_proj", "up_proj"], layers_to_transform=[1, 10]),
    dict(target_modules=["q_proj", "up_proj"], layers_to_transform=3),
    dict(target_modules=["k_proj", "down_proj"], layers_to_transform=[0, 2, 11], layers_pattern="layers"),
    dict(target_modules=["k_proj"], layers_to_transform=[2], layers_pattern=["blocks", "layers"]),
    dict(target_modules=["q_proj", "v_proj", "o_proj"], exclude_modules=["model.layers.1.self_attn.o_proj", "v_proj"]),
    dict(target_modules=["q_proj", "v_proj"], exclude_modules=r".*layers\.[0-4]\..*"),
    dict(target_modules=["q_proj", "lm_head"], modules_to_save=["lm_head"]),
]


def _ours(peft_cfg: LoraConfig) -> AdapterConfig:
    # Round-trip through JSON exactly as save_pretrained writes adapter_config.json.
    return AdapterConfig.from_dict(json.loads(json.dumps(peft_cfg.to_dict(), default=list)))


@pytest.mark.parametrize("kw", PEFT_CONFIGS, ids=lambda kw: json.dumps(kw)[:60])
def test_target_matches_agrees_with_peft(kw):
    cfg = LoraConfig(**kw)
    ours = _ours(cfg)
    expected = {
        n
        for n in NAMES
        if bool(check_target_module_exists(cfg, n))
        and type(check_target_module_exists(cfg, n)).__name__ != "_ExcludedModule"
    }
    got = {n for n in NAMES if ours.target_matches(n)}
    assert got == expected
    assert got  # every config selects something: the comparison is not vacuous


def test_all_linear_string_matches_linear_layers_only():
    ours = AdapterConfig(target_modules="all-linear")
    assert ours.target_matches("model.layers.5.mlp.down_proj")
    assert not ours.target_matches("lm_head")
    assert not ours.target_matches("model.embed_tokens")


PATTERNS = dict(
    rank_pattern={"model.layers.1.self_attn.q_proj": 2, "q_proj": 16, "layers.2.mlp.*": 4},
    alpha_pattern={"v_proj": 64, r"layers\.[3-5]\.self_attn\.o_proj": 3},
)


@pytest.mark.parametrize("rslora", [False, True])
def test_rank_alpha_scaling_agree_with_peft_rules(rslora):
    cfg = LoraConfig(r=8, lora_alpha=32, use_rslora=rslora, target_modules=list(PARENT), **PATTERNS)
    ours = _ours(cfg)
    seen_ranks, seen_alphas = set(), set()
    for name in NAMES:
        r = cfg.rank_pattern.get(get_pattern_key(cfg.rank_pattern.keys(), name), cfg.r)
        alpha = cfg.alpha_pattern.get(get_pattern_key(cfg.alpha_pattern.keys(), name), cfg.lora_alpha)
        assert ours.rank_for(name) == r, name
        assert ours.alpha_for(name) == alpha, name
        want = alpha / math.sqrt(r) if rslora else alpha / r  # peft LoraLayer.update_layer
        assert ours.scaling_for(name) == pytest.approx(want)
        assert ours.scaling_for(name, 5) == pytest.approx(alpha / math.sqrt(5) if rslora else alpha / 5)
        seen_ranks.add(r)
        seen_alphas.add(alpha)
    assert seen_ranks == {2, 4, 8, 16} and seen_alphas == {3, 32, 64}


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"r": 0}, "r must be a positive integer"),
        ({"r": -4}, "r must be a positive integer"),
        ({"r": "8"}, "r must be a positive integer"),
        ({"lora_alpha": "x"}, "lora_alpha must be a number"),
        ({"target_modules": "(q_proj"}, "target_modules regex"),
        ({"target_modules": 3}, "target_modules must be"),
        ({"rank_pattern": {"q_proj": 0}}, "rank_pattern['q_proj'] must be a positive integer"),
        ({"alpha_pattern": {"q_proj": "big"}}, "alpha_pattern['q_proj'] must be a positive number"),
        ({"bias": "some"}, "bias must be one of"),
        # each of these was an internal error (TypeError / re.error) when the modules were matched or the base read
        ({"exclude_modules": 5}, "exclude_modules must be a list of names or a regex string"),
        ({"exclude_modules": "("}, "exclude_modules regex '(' is invalid"),
        ({"layers_to_transform": "0,1"}, "layers_to_transform must be an integer or a list of integers"),
        ({"layers_to_transform": 2.5}, "layers_to_transform must be an integer or a list of integers"),
        ({"modules_to_save": "lm_head"}, "modules_to_save must be a list of module names"),
        ({"base_model_name_or_path": ["x"]}, "base_model_name_or_path must be a string"),
    ],
)
def test_invalid_config_values_raise(raw, message):
    with pytest.raises(AdapterError) as e:
        AdapterConfig.from_dict(raw, source="x/adapter_config.json")
    assert message in e.value.message and "x/adapter_config.json" in e.value.message


@pytest.mark.parametrize(
    "raw, feature",
    [
        ({"lora_bias": True}, "lora_bias"),
        ({"modules_to_save": ["lm_head", "score"]}, "modules_to_save=['score']"),
        ({"peft_type": "IA3"}, "peft_type IA3"),
        ({"trainable_token_indices": [1, 2]}, "trainable_token_indices"),
    ],
)
def test_unsupported_features_are_named(raw, feature):
    feats = AdapterConfig.from_dict({"target_modules": ["q_proj"], **raw}).unsupported()
    assert any(feature in f for f in feats), feats
    assert AdapterConfig.from_dict({"target_modules": ["q_proj"]}).unsupported() == []
    assert AdapterConfig.from_dict({"target_modules": ["q_proj"], "use_dora": True}).unsupported() == []  # served
    # served too (adapters/vocab.py): LoRA on embed_tokens / lm_head, modules_to_save copies of them
    for raw in ({"target_modules": ["q_proj", "embed_tokens", "lm_head"]}, {"modules_to_save": ["lm_head"]}):
        assert AdapterConfig.from_dict({"target_modules": ["q_proj"], **raw}).unsupported() == []


@pytest.mark.parametrize("raw", [{"bias": "all"}, {"bias": "lora_only"}, {"fan_in_fan_out": True}])
def test_settings_peft_makes_harmless_are_not_features(raw):
    # bias: only saved bias tensors matter (scan.py refuses them); fan_in_fan_out: PEFT resets it on nn.Linear
    assert AdapterConfig.from_dict({"target_modules": ["q_proj"], **raw}).unsupported() == []
