"""`inspect`'s verdict agrees with `run`: an adapter whose own base (a local folder) is of an architecture `run`
refuses (Gemma 1, Granite, GPT-2) is not servable, by the same ModelConfig check, with the reason on one line."""

from __future__ import annotations

import json
import shutil

import pytest

from tests import builders


def unserved_base(tmp_path, arch: str):
    """A base folder whose config.json is a real transformers config of `arch` (tiny sizes); no weights needed."""
    import transformers as tf

    cls = {"gemma": tf.GemmaConfig, "granite": tf.GraniteConfig}[arch]
    base = tmp_path / arch
    base.mkdir()
    (base / "config.json").write_text(cls(**builders.TINY).to_json_string())
    return base


def on_base(good_adapter, tmp_path, base):
    path = tmp_path / "adapter"
    shutil.copytree(good_adapter, path)
    cfg = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": str(base)}))
    return path


@pytest.mark.parametrize("arch", ["gemma", "granite"])
def test_unserved_architecture_makes_the_adapter_not_servable(cli, good_adapter, tmp_path, arch):
    base = unserved_base(tmp_path, arch)
    adapter = on_base(good_adapter, tmp_path, base)
    rc, out, err = cli("inspect", adapter)
    assert rc == 1 and "servable by multilora: no" in out and "yes" not in out.split("servable by multilora")[-1]
    want = f"adapter '{adapter}': its base model {base} is not servable: model type '{arch}' is not supported"
    served = "llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3, mixtral, qwen2_moe, qwen3_moe"
    assert err.startswith(f"error: {want} (multilora serves {served})"), err
    assert len(err.strip().splitlines()) == 1
    rep = json.loads(cli("inspect", adapter, "--json")[1])
    assert rep["servable"] is False and rep["reason"].startswith(want) and rep["checked_against"] is None
    assert rep["rank"] == {"min": 8, "max": 8}  # the adapter itself is still described
    # what run does with the same adapter (no --model: its own base): refused, for the same reason
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"prompt": "hi"}\n')
    rc, out, err = cli("run", inp, "-a", adapter, "--device", "cpu")
    assert rc == 1 and f"model type '{arch}' is not supported" in err


def test_unserved_architecture_is_named_before_missing_llama_fields(cli, good_adapter, tmp_path):
    base = tmp_path / "gpt2"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_head": 4}))
    rep = json.loads(cli("inspect", on_base(good_adapter, tmp_path, base), "--json")[1])
    assert rep["servable"] is False and "model type 'gpt2' is not supported" in rep["reason"], rep["reason"]
    rc, out, err = cli("inspect", good_adapter, "--model", base)  # named by the user: the error is the answer
    assert rc == 1 and out == "" and f"{base}: model type 'gpt2' is not supported" in err
