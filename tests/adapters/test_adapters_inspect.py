"""`multilora inspect`: the report for good adapters, and message + exit code for every bad input."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests import builders


def derive(src: Path, dst: Path, config=None, tensors=None) -> Path:
    """Copy adapter `src` to `dst`, then edit its config dict and/or its safetensors tensor dict in place."""
    shutil.copytree(src, dst)
    if config is not None:
        cfg = json.loads((dst / "adapter_config.json").read_text())
        config(cfg)
        (dst / "adapter_config.json").write_text(json.dumps(cfg))
    if tensors is not None:
        st = load_file(dst / "adapter_model.safetensors")
        tensors(st)
        save_file(st, dst / "adapter_model.safetensors", metadata={"format": "pt"})
    return dst


def test_good_adapter_report(cli, good_adapter, llama_base):
    rc, out, err = cli("inspect", good_adapter, "--model", llama_base)
    assert rc == 0 and err == ""
    for text in (
        "rank             8",
        "alpha            16",
        "scaling          2 (alpha/r)",
        "q_proj, v_proj",
        "0-1 (2 of 2 layers)",
        "servable by multilora: yes",
        f"shapes checked against {llama_base}",
    ):
        assert text in out, text
    rc, out, err = cli("inspect", good_adapter, "--json")
    assert rc == 0
    rep = json.loads(out)  # exactly one JSON object on stdout
    hidden, kv = 64, 32  # builders.TINY: hidden 64, 2 kv heads of 16
    want = 2 * 8 * ((hidden + hidden) + (hidden + kv))  # 2 layers x r x (in + out) for q and v
    assert rep["num_params"] == want and rep["bytes"] == 4 * want and rep["bytes_bf16"] == 2 * want
    # no --model: the adapter's own base is a model folder here, so the shapes are checked against it
    assert rep["servable"] is True and rep["reason"] is None and rep["checked_against"] == str(llama_base)
    assert rep["rank"] == {"min": 8, "max": 8} and rep["scaling"] == {"min": 2.0, "max": 2.0}
    assert rep["dtype"] == "float32" and rep["layers"] == [0, 1]
    assert [(m["module"], m["layers"], m["in_features"], m["out_features"]) for m in rep["modules"]] == [
        ("q_proj", [0, 1], 64, 64),
        ("v_proj", [0, 1], 64, 32),
    ]
    assert rep["base_model"] == str(llama_base)


def test_inspect_without_model_checks_only_a_local_base(cli, good_adapter, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(good_adapter, moved)
    cfg = json.loads((moved / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(tmp_path / "gone")  # trained elsewhere: nothing to check against here
    (moved / "adapter_config.json").write_text(json.dumps(cfg))
    rc, out, err = cli("inspect", moved)
    assert rc == 0 and "shapes not checked (pass --model to check)" in out
    rc, out, err = cli("inspect", good_adapter)
    assert rc == 0 and "shapes checked against" in out


def test_patterned_rslora_report(cli, zoo, llama_base, tmp_path):
    path = zoo.adapter(
        "inspect-patterned",
        llama_base,
        r=4,
        alpha=8,
        targets="all-linear",
        use_rslora=True,
        rank_pattern={"down_proj": 16},
    )
    bf16 = derive(path, tmp_path / "bf16", tensors=lambda st: st.update({k: v.bfloat16() for k, v in st.items()}))
    rc, out, _ = cli("inspect", path, "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["rank"] == {"min": 4, "max": 16} and rep["use_rslora"]
    assert rep["scaling"] == {"min": 8 / 4, "max": 8 / 2}  # alpha / sqrt(r): r 16 -> 2, r 4 -> 4
    rc, out, _ = cli("inspect", bf16, "--json")
    half = json.loads(out)
    assert half["dtype"] == "bfloat16" and half["bytes"] == half["bytes_bf16"] == rep["bytes"] // 2
    rc, out, _ = cli("inspect", path)
    assert "4 - 16 (rank_pattern)" in out and "rsLoRA: alpha/sqrt(r)" in out


@pytest.fixture(scope="module")
def bad(zoo, llama_base, qwen2_base, good_adapter, tmp_path_factory):
    """name -> (path of a broken adapter, extra CLI args)."""
    root = tmp_path_factory.mktemp("bad")
    g = good_adapter
    a = {}
    first_b = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    first_a = first_b.replace("lora_B", "lora_A")
    # Real PEFT checkpoints using features we cannot serve.
    dora = zoo.adapter("dora", llama_base, use_dora=True)  # served (test_dora_is_servable_with_its_cost)
    a["bias"] = zoo.adapter("bias", qwen2_base, bias="all")
    # embed_tokens / lm_head adapters are served (test_vocab_adapters_are_servable_with_their_cost), but not with a
    # config that does not select what the tensors hold, nor a modules_to_save copy of another module
    emb = zoo.adapter("emb", llama_base, targets=["embed_tokens", "q_proj"])
    a["embedding_keys"] = derive(emb, root / "emb_keys", config=lambda c: c.update(target_modules=["q_proj"]))
    a["modules_to_save"] = zoo.adapter("mts_norm", llama_base, modules_to_save=["norm"])
    # DoRA's checkpoint and config disagreeing: magnitudes without use_dora, use_dora without magnitudes
    a["dora_keys"] = derive(dora, root / "dora_keys", config=lambda c: c.update(use_dora=False))
    a["dora_no_magnitude"] = derive(g, root / "dora_no_magnitude", config=lambda c: c.update(use_dora=True))
    a["ia3"] = derive(g, root / "ia3", config=lambda c: c.update(peft_type="IA3"))
    # Broken files.
    a["garbage"] = derive(g, root / "garbage")
    (a["garbage"] / "adapter_model.safetensors").write_bytes(b"not a safetensors file" * 50)
    a["truncated"] = derive(g, root / "truncated")
    data = (g / "adapter_model.safetensors").read_bytes()
    (a["truncated"] / "adapter_model.safetensors").write_bytes(data[: len(data) * 2 // 3])
    a["no_config"] = derive(g, root / "no_config")
    (a["no_config"] / "adapter_config.json").unlink()
    a["bad_json"] = derive(g, root / "bad_json")
    (a["bad_json"] / "adapter_config.json").write_text('{"r": 8,')
    a["no_weights"] = derive(g, root / "no_weights")
    (a["no_weights"] / "adapter_model.safetensors").unlink()
    a["bin_garbage"] = derive(g, root / "bin_garbage")
    (a["bin_garbage"] / "adapter_model.safetensors").unlink()
    (a["bin_garbage"] / "adapter_model.bin").write_bytes(b"\x80\x02garbage" * 20)
    a["bin_pickle"] = derive(g, root / "bin_pickle")
    (a["bin_pickle"] / "adapter_model.safetensors").unlink()
    torch.save({first_a: torch.zeros(8, 64), "x": argparse.Namespace(evil=1)}, a["bin_pickle"] / "adapter_model.bin")
    # Broken tensors.
    a["missing_b"] = derive(g, root / "missing_b", tensors=lambda st: st.pop(first_b))
    a["missing_a"] = derive(g, root / "missing_a", tensors=lambda st: st.pop(first_a))
    a["nan"] = derive(g, root / "nan", tensors=lambda st: st[first_b].view(-1).__setitem__(3, float("nan")))
    a["inf"] = derive(g, root / "inf", tensors=lambda st: st[first_a].view(-1).__setitem__(0, float("-inf")))
    a["rank0"] = derive(g, root / "rank0", config=lambda c: c.update(r=0))
    a["rank_mismatch"] = derive(g, root / "rank_mismatch", config=lambda c: c.update(r=16))
    a["untargeted"] = derive(g, root / "untargeted", config=lambda c: c.update(target_modules=["q_proj"]))
    a["pair_shapes"] = derive(g, root / "pair_shapes", tensors=lambda st: st.update({first_b: torch.zeros(64, 4)}))
    a["odd_key"] = derive(
        g,
        root / "odd_key",
        tensors=lambda st: st.update(
            {"base_model.model.model.layers.0.mlp.experts.0.gate_proj.lora_A.weight": torch.zeros(8, 64)}
        ),
    )
    out = {k: (v, []) for k, v in a.items()}
    # Good adapter, wrong base.
    wide = zoo.base("wide", "llama", hidden_size=128)
    short = zoo.base("short", "llama", num_hidden_layers=1)
    out["base_shape"] = (g, ["--model", wide])
    out["base_layers"] = (g, ["--model", short])
    out["missing_path"] = ("./no/such/adapter", [])
    out["missing_model"] = (g, ["--model", "./no/such/model"])
    return out


# name -> (message fragments on stderr, does stdout still carry a report whose verdict is "no")
CASES = {
    "dora_keys": (["q_proj: it has a DoRA lora_magnitude_vector but adapter_config.json has no use_dora"], True),
    "dora_no_magnitude": (["q_proj: use_dora is set but it has no lora_magnitude_vector"], True),
    "bias": (["trained biases (bias='all')"], True),
    "modules_to_save": (["modules_to_save=['norm']"], True),
    "embedding_keys": (["embed_tokens has LoRA tensors but adapter_config.json target_modules does not select"], True),
    "ia3": (["peft_type IA3 (only LoRA adapters are served)"], True),
    "garbage": (["adapter_model.safetensors is corrupt or truncated", "re-download"], True),
    "truncated": (["adapter_model.safetensors is corrupt or truncated", "past the end of the file"], True),
    "no_config": (["no adapter_config.json", "save_pretrained"], False),
    "bad_json": (["adapter_config.json: unreadable JSON"], False),
    "no_weights": (["no adapter_model.safetensors or adapter_model.bin"], True),
    "bin_garbage": (["adapter_model.bin is corrupt or truncated"], True),
    "bin_pickle": (["holds more than plain tensors and was not unpickled"], True),
    "missing_b": (["model.layers.0.self_attn.q_proj has lora_A but no lora_B"], True),
    "missing_a": (["model.layers.0.self_attn.q_proj has lora_B but no lora_A"], True),
    "nan": (["q_proj: lora_B contains NaN or Inf"], True),
    "inf": (["q_proj: lora_A contains NaN or Inf"], True),
    "rank0": (["r must be a positive integer", "got 0"], False),
    "rank_mismatch": (["has rank 8 but adapter_config.json gives it r=16"], True),
    "untargeted": (["v_proj has LoRA tensors but adapter_config.json target_modules does not select it"], True),
    "pair_shapes": (["lora_A (8, 64) and lora_B (64, 4) are not a [r, in] / [out, r] pair"], True),
    "odd_key": (["experts.0.gate_proj is expert LoRA (mixture of experts)", "(llama) has no experts"], True),
    "base_shape": (
        ["does not fit base model", "(it was trained on", "maps 64 -> 64 features", "maps 128 -> 128"],
        True,
    ),
    "base_layers": (["does not fit base model", "is layer 1 but the base has 1 layers"], True),
    "missing_path": (["adapter './no/such/adapter': path", "does not exist"], False),
    "missing_model": (["model './no/such/model': path", "does not exist"], False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_message_and_exit_code(cli, bad, case):
    path, extra = bad[case]
    fragments, has_report = CASES[case]
    rc, out, err = cli("inspect", path, *extra)
    assert rc == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    if has_report:
        assert "servable by multilora: no, because" in out
        rc2, out2, err2 = cli("inspect", path, "--json", *extra)
        rep = json.loads(out2)
        assert rc2 == 1 and rep["servable"] is False and rep["reason"] in err2
    else:
        assert out == ""


def test_dora_is_servable_with_its_cost(cli, zoo, llama_base):
    """A DoRA adapter (once refused) is served: inspect says so and counts its magnitudes and slot bytes."""
    from multilora_cli.adapters.costs import dora_slot_bytes
    from multilora_cli.models.config import ModelConfig

    path = zoo.adapter("dora", llama_base, use_dora=True)
    rc, out, err = cli("inspect", path, "--model", llama_base, "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["servable"] is True, err
    cfg = ModelConfig.from_dir(llama_base)
    (extra,) = rep["extras"]
    mags = 2 * (cfg.q_size + cfg.kv_size)  # PEFT's default targets: q_proj and v_proj, in 2 layers
    assert extra["kind"] == "dora" and extra["params"] == mags and extra["bytes_bf16"] == 2 * mags
    assert extra["slot_bytes"] == dora_slot_bytes(cfg) > 0
    assert rep["bytes_bf16"] == 2 * (rep["num_params"] + mags) and rep["bytes"] == 4 * (rep["num_params"] + mags)
    rc, out, _ = cli("inspect", path, "--model", llama_base)
    assert rc == 0 and "servable by multilora: yes" in out and "dora" in out and "per GPU slot" in out


def test_every_bad_case_is_exercised(bad):
    assert set(bad) == set(CASES)
    assert builders.TINY["hidden_size"] == 64  # the shape fragments above assume the tiny model


def test_adapter_given_as_model_hint_names_inspect_s_own_argument(cli, good_adapter):
    # the hint was run's: "pass it with --adapters", a flag inspect does not have
    rc, out, err = cli("inspect", good_adapter, "--model", good_adapter)
    assert rc == 1 and out == "" and "not a base model" in err and "--adapters" not in err
    assert f"multilora inspect {good_adapter}" in err, err


def test_inspect_piped_keeps_each_row_on_one_line(good_adapter):
    # Off a terminal rich wrapped the summary at 80 columns ("... 14.3 kB (14,336" / "bytes) in bf16").
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    p = subprocess.run(
        [sys.executable, "-m", "multilora_cli", "inspect", str(good_adapter)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    size = next(line for line in p.stdout.splitlines() if line.startswith("size"))
    assert size.rstrip().endswith("in bf16"), p.stdout


def test_inspect_verdict_is_one_line_however_long(bad):
    import os
    import subprocess
    import sys

    path, extra = bad["base_shape"]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    p = subprocess.run(
        [sys.executable, "-m", "multilora_cli", "inspect", str(path), *map(str, extra)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 1
    verdict = p.stdout.rstrip().splitlines()[-1]
    assert verdict.startswith("servable by multilora: no, because") and "maps 128 -> 128" in verdict, p.stdout


def test_vocab_adapters_are_servable_with_their_cost(cli, zoo, llama_base):
    """LoRA on embed_tokens / lm_head and modules_to_save copies (once refused) are served: inspect lists the LoRA
    as module rows and each one's GPU slot cost (a copy: [V, H] per slot that holds the adapter)."""
    from multilora_cli.adapters.costs import full_copy_bytes, vocab_lora_slot_bytes
    from multilora_cli.models.config import ModelConfig

    cfg = ModelConfig.from_dir(llama_base)
    vh = cfg.vocab_size * cfg.hidden_size
    lora = zoo.adapter("emb_head", llama_base, targets=["embed_tokens", "q_proj", "lm_head"])
    rc, out, err = cli("inspect", lora, "--model", llama_base, "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["servable"] is True, err
    rows = {r["module"]: r for r in rep["modules"]}
    assert rows["embed_tokens"]["in_features"] == cfg.vocab_size and rows["embed_tokens"]["out_features"] == 64
    assert rows["lm_head"]["params"] == 8 * (64 + cfg.vocab_size) and rows["lm_head"]["layers"] == []
    assert rep["modules_adapted"] == ["q_proj", "embed_tokens", "lm_head"]
    kinds = {e["kind"]: e for e in rep["extras"]}
    assert kinds["lm_head_lora"]["slot_bytes"] == vocab_lora_slot_bytes(cfg, "lm_head", 8) > 0
    assert kinds["embed_tokens_lora"]["slot_bytes"] == vocab_lora_slot_bytes(cfg, "embed_tokens", 8)
    copy = zoo.adapter("mts_head", llama_base, modules_to_save=["lm_head"])
    rc, out, err = cli("inspect", copy, "--model", llama_base, "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["servable"] is True, err
    (extra,) = rep["extras"]
    assert extra["kind"] == "lm_head_modules_to_save" and extra["params"] == vh
    assert extra["slot_bytes"] == full_copy_bytes(cfg) == 2 * vh
    assert rep["bytes_bf16"] == 2 * (rep["num_params"] + vh)
    rc, out, _ = cli("inspect", copy, "--model", llama_base)
    assert rc == 0 and "servable by multilora: yes" in out and "modules_to_save" in out and "per GPU slot" in out
