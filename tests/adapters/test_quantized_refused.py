"""A quantized base multilora does not serve is refused with one clear error naming its method, never loaded as if it
were not (scales ignored, garbage text, exit 0): by `run` (exit 1), `inspect` (not servable) and `economics`, from
config.json's quantization_config or, without one, from the safetensors headers. The declared checkpoint is a
compressed-tensors W8A8 int8 one (int8 weights beside per-channel float32 weight_scale tensors); the undeclared one
holds float8_e4m3fn weights with no quantization_config saying how to read them. FP8 checkpoints multilora serves
are tested in tests/models/test_fp8.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from multilora_cli.errors import UnsupportedModelError
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.quantization import quant_method

INT8_W8A8 = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True},
        }
    },
}


def fp8_checkpoint(base: Path, out: Path, quantization_config: dict | None, int8: bool = False) -> Path:
    """Copy `base` with every decoder linear weight stored as float8_e4m3fn (int8: int8) + a `<name>_scale` (what
    llm-compressor writes); `quantization_config` goes into config.json when given."""
    shutil.copytree(base, out)
    tensors = load_file(out / "model.safetensors")
    for name in [n for n in tensors if n.endswith("_proj.weight")]:
        w = tensors[name]
        top = 127 if int8 else torch.finfo(torch.float8_e4m3fn).max
        scale = w.abs().amax(dim=1, keepdim=True) / top
        tensors[name] = (w / scale).round().to(torch.int8) if int8 else (w / scale).to(torch.float8_e4m3fn)
        tensors[name + "_scale"] = scale.float()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def fp8_base(llama_base, tmp_path_factory) -> Path:
    return fp8_checkpoint(llama_base, tmp_path_factory.mktemp("int8") / "base", INT8_W8A8, int8=True)


@pytest.fixture(scope="module")
def fp8_undeclared(llama_base, tmp_path_factory) -> Path:
    return fp8_checkpoint(llama_base, tmp_path_factory.mktemp("fp8-bare") / "base", None)


def test_declared_quantization_is_refused_naming_the_method(fp8_base):
    assert load_file(fp8_base / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"].dtype == torch.int8
    with pytest.raises(UnsupportedModelError) as e:
        ModelConfig.from_dir(fp8_base)
    msg = e.value.one_line()
    assert msg.startswith(f"{fp8_base}: the base model is quantized (compressed-tensors (int-quantized), "), msg
    assert "does not serve" in msg and "FP8 checkpoints (compressed-tensors" in msg and "unquantized" in msg


def test_quantized_weights_without_a_config_are_refused_too(fp8_undeclared):
    with pytest.raises(UnsupportedModelError) as e:
        ModelConfig.from_dir(fp8_undeclared)
    msg = e.value.one_line()
    assert msg.startswith(
        f"{fp8_undeclared}: the checkpoint holds quantized weights (model.layers.0.mlp.down_proj.weight is F8_E4M3 in "
        "model.safetensors), though config.json declares no quantization_config saying how to read them"
    ), msg


def test_scale_tensors_alone_are_refused(llama_base, tmp_path):
    # int8 / fp8 weights aside, the tensors quantizers add are a sign too (GPTQ packs into int32 qweight)
    out = tmp_path / "gptq"
    shutil.copytree(llama_base, out)
    tensors = load_file(out / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.qweight"] = torch.zeros(8, 64, dtype=torch.int32)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        UnsupportedModelError, match=r"\(model.layers.0.self_attn.q_proj.qweight in model.safetensors\)"
    ):
        ModelConfig.from_dir(out)


def test_sharded_quantized_checkpoint_is_refused(fp8_undeclared, tmp_path):
    shard = tmp_path / "sharded"
    shard.mkdir()
    shutil.copy(fp8_undeclared / "config.json", shard / "config.json")
    tensors = load_file(fp8_undeclared / "model.safetensors")
    names = sorted(tensors)
    plain = [n for n in names if not n.endswith(("_proj.weight", "_scale"))]
    quant = [n for n in names if n not in plain]
    save_file({n: tensors[n] for n in plain}, shard / "model-00001-of-00002.safetensors")
    save_file({n: tensors[n] for n in quant}, shard / "model-00002-of-00002.safetensors")
    weight_map = {n: "model-00001-of-00002.safetensors" for n in plain}
    weight_map |= {n: "model-00002-of-00002.safetensors" for n in quant}
    (shard / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(UnsupportedModelError, match="model-00002-of-00002.safetensors"):
        ModelConfig.from_dir(shard)


FP8_GROUP = {
    "targets": ["Linear"],
    "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
}


def _ct(**kw) -> dict:
    """A compressed-tensors FP8 config with `kw` changed (group_0 through `group`)."""
    group = {**FP8_GROUP, **kw.pop("group", {})}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": group}} | kw


@pytest.mark.parametrize(
    "qc, method",
    [
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, r"fp8, block-wise FP8 weight scales"),
        (
            _ct(group={"weights": {**FP8_GROUP["weights"], "strategy": "block", "block_structure": [128, 128]}}),
            r"compressed-tensors \(float-quantized\), block-wise FP8 weight scales \(strategy 'block'\)",
        ),
        (_ct(format="int-quantized"), r"compressed-tensors \(int-quantized\), only the float-quantized"),
        (_ct(format="pack-quantized"), r"compressed-tensors \(pack-quantized\)"),
        (_ct(group={"weights": {**FP8_GROUP["weights"], "type": "int"}}), "group_0 weights are int8, not fp8"),
        (_ct(ignore=["lm_head", "re:.*mlp.down_proj"]), "ignore list leaves decoder projection model.layers.0.mlp"),
        (_ct(group={"targets": ["re:.*self_attn.*"]}), "targets leave decoder projection model.layers.0.mlp.gate"),
        (_ct(kv_cache_scheme={"num_bits": 8, "type": "float"}), "an FP8 KV cache"),
        ({"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["down_proj"]}, "modules_to_not_convert leaves"),
        ({"quant_method": "gguf"}, "gguf"),
        ({"quant_method": "awq", "bits": 4, "version": "gemm"}, "awq"),
        ({"quant_method": "gptq", "bits": 4}, "gptq"),
        ({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "bitsandbytes"),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "bitsandbytes"),
        ({"bits": 4}, "unnamed"),
    ],
)
def test_every_method_is_refused(llama_base, tmp_path, qc, method):
    cfg = json.loads((llama_base / "config.json").read_text())
    with pytest.raises(UnsupportedModelError, match=rf"the base model is quantized \(.*{method}"):
        ModelConfig.from_dict({**cfg, "quantization_config": qc}, name_or_path="m")
    # compressed-tensors' older key
    with pytest.raises(UnsupportedModelError, match="is quantized"):
        ModelConfig.from_dict({**cfg, "compression_config": qc}, name_or_path="m")
    assert quant_method({"quantization_config": None}) is None and quant_method({"quantization_config": {}}) is None


def test_plain_checkpoints_pass(llama_base):
    assert ModelConfig.from_dir(llama_base).model_type == "llama"


def test_run_refuses_it_before_any_work(cli, fp8_base, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"prompt": "hello"}\n')
    rc, out, err = cli("run", inp, "--model", fp8_base, "--device", "cpu")
    assert rc == 1 and out == ""
    assert err.startswith("error: ") and "quantized (compressed-tensors (int-quantized)" in err
    assert len(err.strip().splitlines()) == 1


def test_inspect_and_economics_say_why(cli, fp8_base, good_adapter, tmp_path):
    rc, out, err = cli("inspect", good_adapter, "--model", fp8_base)
    assert rc == 1 and "is quantized (compressed-tensors" in err
    own = tmp_path / "adapter"  # the adapter's own base is the quantized one: what `run -a` would load
    shutil.copytree(good_adapter, own)
    cfg = json.loads((own / "adapter_config.json").read_text())
    (own / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": str(fp8_base)}))
    rc, out, err = cli("inspect", own, "--json")
    rep = json.loads(out)
    assert rc == 1 and rep["servable"] is False and "compressed-tensors" in rep["reason"]
    assert rep["reason"].startswith(f"adapter '{own}': its base model {fp8_base} is not servable: the base model is")
    assert err.startswith(f"error: adapter '{own}': its base model") and len(err.strip().splitlines()) == 1
    rc, out, err = cli("economics", "--tenants", "4", "--model", fp8_base)
    assert rc == 1 and "is quantized (compressed-tensors" in err


def test_gguf_is_refused_naming_it(tmp_path, cli):
    (tmp_path / "model-Q4_K_M.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(UnsupportedModelError, match=r"a GGUF \(llama.cpp\) model, which multilora does not serve"):
        ModelConfig.from_dir(tmp_path)
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"prompt": "hello"}\n')
    rc, out, err = cli("run", inp, "--model", tmp_path, "--device", "cpu")
    assert rc == 1 and "GGUF" in err and len(err.strip().splitlines()) == 1
