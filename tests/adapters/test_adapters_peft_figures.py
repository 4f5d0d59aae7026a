"""Every figure `multilora inspect --json` prints (rank, alpha, scaling, params, bytes) is PEFT's own, read back
from the PeftModel that PEFT builds from the same checkpoint; and settings PEFT makes harmless are served."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from multilora_cli.adapters.peft import load_adapter
from multilora_cli.adapters.tensors import TensorFile
from multilora_cli.models.config import ATTN_MODULES

# name -> build_adapter kwargs on the tiny llama
VARIANTS = {
    "plain": dict(r=8, alpha=16),
    "float-alpha": dict(r=8, alpha=7.5, targets=("q_proj", "k_proj", "o_proj")),
    "patterns": dict(
        r=4,
        alpha=8,
        targets="all-linear",
        rank_pattern={"q_proj": 16, "model.layers.1.mlp.down_proj": 2},
        alpha_pattern={"v_proj": 3, r"layers\.0\.mlp\.up_proj": 12},
    ),
    "rslora-patterns": dict(
        r=16,
        alpha=8,
        targets="all-linear",
        use_rslora=True,
        rank_pattern={"k_proj": 4},
        alpha_pattern={"gate_proj": 32},
    ),
    "regex": dict(r=6, alpha=12, targets=r".*\.layers\.1\.(self_attn\.(q|v)_proj|mlp\.down_proj)"),
    "bin": dict(r=4, alpha=4, targets=("q_proj", "up_proj"), safetensors=False),
    "layers-to-transform": dict(
        r=8, alpha=8, targets=("v_proj", "gate_proj"), layers_to_transform=[1], layers_pattern="layers"
    ),
    "bias-all": dict(r=8, alpha=16, bias="all"),  # a Llama has no linear biases: nothing extra is saved
}


def _peft(base, adapter):
    """PEFT's view of the checkpoint: {module name: (r, alpha, scaling)}, trainable params, merged weight deltas."""
    import transformers as tf
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    model = tf.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pm = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    layers = {
        name.removeprefix("base_model.model."): (m.r["default"], m.lora_alpha["default"], m.scaling["default"])
        for name, m in pm.named_modules()
        if isinstance(m, LoraLayer)
    }
    trainable = pm.get_nb_trainable_parameters()[0]
    merged = pm.merge_and_unload().state_dict()
    return layers, trainable, {k: merged[k] - before[k] for k in before}


def _full_name(layer: int, module: str) -> str:
    return f"model.layers.{layer}.{'self_attn' if module in ATTN_MODULES else 'mlp'}.{module}"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_inspect_figures_are_peft_figures(cli, zoo, llama_base, variant):
    adapter = zoo.adapter(f"figures-{variant}", llama_base, **VARIANTS[variant])
    rc, out, err = cli("inspect", adapter, "--json")
    assert rc == 0 and err == "", err
    rep = json.loads(out)
    layers, trainable, _ = _peft(llama_base, adapter)

    seen = {}
    for row in rep["modules"]:
        for layer in row["layers"]:
            name = _full_name(layer, row["module"])
            r, alpha, scaling = layers[name]
            assert (row["rank"], row["alpha"]) == (r, alpha), name
            assert row["scaling"] == pytest.approx(scaling, rel=1e-12), name
            seen[name] = r * (row["in_features"] + row["out_features"])
        assert row["params"] == sum(seen[_full_name(i, row["module"])] for i in row["layers"])
    assert set(seen) == set(layers)  # every module PEFT adapts, and no other
    for key, i in (("rank", 0), ("alpha", 1), ("scaling", 2)):
        values = [v[i] for v in layers.values()]
        assert rep[key]["min"] == pytest.approx(min(values)) and rep[key]["max"] == pytest.approx(max(values)), key
    assert rep["num_params"] == trainable == sum(seen.values())
    tf = TensorFile(next(p for p in adapter.iterdir() if p.name.startswith("adapter_model.")), variant)
    stored = sum(torch.Size(tf.shape(k)).numel() * tf.dtype(k).itemsize for k in tf.keys())
    assert rep["bytes"] == stored and rep["bytes_bf16"] == 2 * trainable


@pytest.mark.parametrize("setting", ["fan_in_fan_out", "bias"])
def test_settings_peft_makes_harmless_are_served_as_peft_applies_them(
    cli, zoo, llama_base, good_adapter, tmp_path, setting
):
    # fan_in_fan_out: PEFT resets it to False on nn.Linear; bias on a base without linear biases saves nothing
    path = tmp_path / setting
    shutil.copytree(good_adapter, path)
    cfg = json.loads((path / "adapter_config.json").read_text())
    cfg.update(fan_in_fan_out=True) if setting == "fan_in_fan_out" else cfg.update(bias="lora_only")
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    rc, out, err = cli("inspect", path)
    assert rc == 0 and "servable by multilora: yes" in out, err
    _, _, deltas = _peft(llama_base, path)
    ours = load_adapter(path, setting)
    for (layer, module), m in ours.modules.items():
        torch.testing.assert_close(
            m.scaling * (m.b @ m.a), deltas[_full_name(layer, module) + ".weight"], atol=2e-6, rtol=1e-4
        )


def test_unservable_adapter_reports_the_ranks_peft_gives(cli, zoo, llama_base):
    # r=8 is used by no module here: the config alone would say "rank 2 - 8"
    dora = zoo.adapter(
        "figures-tokens",
        llama_base,
        r=8,
        alpha=16,
        trainable_token_indices=[3, 4],
        rank_pattern={"q_proj": 4, "v_proj": 2},
        alpha_pattern={"v_proj": 6},
    )
    rc, out, err = cli("inspect", dora, "--json")
    rep = json.loads(out)
    assert rc == 1 and rep["servable"] is False and "trainable token" in err
    layers, _, _ = _peft(llama_base, dora)
    for key, i in (("rank", 0), ("alpha", 1), ("scaling", 2)):
        values = [v[i] for v in layers.values()]
        assert rep[key] == {"min": pytest.approx(min(values)), "max": pytest.approx(max(values))}, key
    assert rep["rank"] == {"min": 2, "max": 4} and rep["num_params"] is None


def test_unreadable_own_base_leaves_shapes_unchecked(cli, good_adapter, tmp_path):
    base = tmp_path / "gpt2ish"
    base.mkdir()
    # unreadable, not unservable (an unserved architecture makes the adapter not servable: test_inspect_verdict.py)
    (base / "config.json").write_text(json.dumps({"model_type": "llama", "n_embd": 64}))
    path = tmp_path / "adapter"
    shutil.copytree(good_adapter, path)
    cfg = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": str(base)}))
    rc, out, err = cli("inspect", path)  # was: exit 1 on the base's config, no report at all
    assert rc == 0 and err == "" and "shapes not checked (base unreadable: " in out
    rep = json.loads(cli("inspect", path, "--json")[1])
    assert rep["checked_against"] is None and str(base) in rep["check_note"] and rep["servable"]
    rc, out, err = cli("inspect", path, "--model", base)  # named by the user: its error is the answer
    assert rc == 1 and out == "" and str(base) in err


def test_folder_without_config_says_what_it_holds(cli, good_adapter, llama_base, tmp_path):
    fleet = tmp_path / "fleet"
    for name in ("legal", "medical"):
        shutil.copytree(good_adapter, fleet / name)
    (tmp_path / "empty").mkdir()
    for folder, needle in (
        (fleet, f"adapters in subfolders (legal, medical): point at one, e.g. {fleet / 'legal'}"),
        (llama_base, "a base model folder (config.json), not an adapter: pass it with --model"),
        (tmp_path / "empty", "the folder is empty"),
    ):
        for extra in ((), ("--json",)):
            rc, out, err = cli("inspect", folder, *extra)
            assert rc == 1 and out == "" and err.count("\n") == 1 and needle in err, err
