"""Real inputs: measured run stats, real PEFT adapters, model directories, Hub ids that name a preset."""

from __future__ import annotations

import json
import math

import pytest
from safetensors import safe_open

from multilora_cli.economics import Scenario, compute
from multilora_cli.engine.request import EngineStats
from multilora_cli.errors import AdapterError, UsageError
from multilora_cli.io.stats import RunStats


def write_stats(path, **kw):
    """A stats file as `multilora run --stats` writes it: RunStats around the engine's EngineStats."""
    engine = EngineStats(model="meta-llama/Llama-2-7b-hf", device="cuda:0 NVIDIA H100 80GB HBM3", dtype="bfloat16",
                         requests=400, completion_tokens=102_400, prompt_tokens=40_000, steps=2_000,
                         wall_seconds=40.0, slot_loads=300, slot_hits=100, max_loras=8)
    for k, v in kw.items():
        setattr(engine, k, v)
    run = RunStats()
    for _ in range(400):
        run.add_ok("a", 100, 256)
    path.write_text(json.dumps(run.to_dict(engine=engine.to_dict(), wall_seconds=55.0, gpu_hour_usd=2.99)))
    return path


def test_stats_replace_the_roofline_throughput(tmp_path):
    stats = write_stats(tmp_path / "run_stats.json")
    measured = 102_400 / 40.0  # completion_tokens_per_second
    rep = compute(Scenario(tenants=100, model="llama-2-7b", stats=str(stats)))
    th, fl, sl = rep.section("throughput"), rep.section("fleet"), rep.section("slots")
    assert th["tokens_per_s_measured"] == th["tokens_per_s"] == pytest.approx(measured)
    assert th["measured_vs_roofline"] == pytest.approx(measured / th["tokens_per_s_roofline"])
    assert fl["shared_replicas_by_throughput"] == math.ceil(100 * 50 / measured)
    roof = compute(Scenario(tenants=100, model="llama-2-7b"))
    assert roof.section("fleet")["dedicated_gpus"] == fl["dedicated_gpus"]  # dedicated stays on the roofline
    # the measured run also grounds the slot arithmetic
    assert sl["step_seconds"] == pytest.approx(40.0 / 2000)
    assert sl["measured_hit_rate"] == pytest.approx(100 / 400)
    assert sl["measured_loads_per_step"] == pytest.approx(300 / 2000)
    out = {a.key: a for a in rep.assumptions}["output_tokens"]
    assert (out.value, out.source) == (102_400 / 400, "measured")
    assert not rep.warnings  # same model (by Hub id), a GPU device


def test_stats_from_another_model_or_cpu_warn(tmp_path):
    stats = write_stats(tmp_path / "s.json", model="/tmp/tiny-llama", device="cpu")
    rep = compute(Scenario(tenants=10, model="llama-3-8b", stats=str(stats)))
    assert any("tiny-llama" in w for w in rep.warnings) and any("CPU" in w for w in rep.warnings)
    a100 = write_stats(tmp_path / "a.json", device="cuda:0 NVIDIA A100-SXM4-80GB")
    assert any("A100" in w for w in compute(Scenario(tenants=10, stats=str(a100))).warnings)
    assert not compute(Scenario(tenants=10, stats=str(a100), gpu="a100-80gb")).warnings


def test_adapter_shape_from_a_real_peft_adapter(tiny):
    rep = compute(Scenario(tenants=5, adapter=str(tiny["qv"])))  # --model defaults to the adapter's base
    assert {a.key: a.value for a in rep.assumptions}["model"] == str(tiny["base"])
    with safe_open(str(tiny["qv"] / "adapter_model.safetensors"), "pt") as f:
        stored = sum(f.get_slice(k).get_shape()[0] * f.get_slice(k).get_shape()[1] for k in f.keys())
    # tiny llama: hidden 64, 4 heads x 16 -> q 64->64, 2 kv heads -> v 64->32; r=8, 2 layers
    assert rep.section("adapter")["params"] == stored == 2 * 8 * ((64 + 64) + (64 + 32))
    assert rep.section("adapter")["bytes"] == stored * 2  # served in bf16, stored in fp32
    assert [(m["module"], m["rank"], m["layers"]) for m in rep.modules] == [("q_proj", 8, 2), ("v_proj", 8, 2)]


def test_rank_pattern_adapter_counts_each_rank(tiny):
    import peft
    import transformers as tf

    rep = compute(Scenario(tenants=5, adapter=str(tiny["pattern"]), model=str(tiny["base"])))
    assert ("down_proj", 4) in [(m["module"], m["rank"]) for m in rep.modules]
    assert ("up_proj", 8) in [(m["module"], m["rank"]) for m in rep.modules]
    model = peft.PeftModel.from_pretrained(tf.AutoModelForCausalLM.from_pretrained(tiny["base"]), tiny["pattern"])
    lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert rep.section("adapter")["params"] == lora


def test_adapter_on_the_wrong_base_is_refused(tiny):
    with pytest.raises(AdapterError, match="q_proj"):
        compute(Scenario(tenants=5, adapter=str(tiny["qv"]), model="llama-2-7b"))
    with pytest.raises(UsageError, match="--rank"):
        Scenario(tenants=5, adapter=str(tiny["qv"]), rank=8)


def test_model_from_a_directory_and_its_config_json(tiny):
    a = compute(Scenario(tenants=3, model=str(tiny["base"]), rank=4, targets="all"))
    b = compute(Scenario(tenants=3, model=str(tiny["base"] / "config.json"), rank=4, targets="all"))
    import transformers as tf

    hf = tf.AutoModelForCausalLM.from_pretrained(tiny["base"])
    assert a.section("full_copy")["base_params"] == b.section("full_copy")["base_params"] == hf.num_parameters()


def test_hub_id_of_a_preset_needs_no_download(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rep = compute(Scenario(tenants=3, model="meta-llama/Llama-2-7b-hf"))
    assert rep.section("adapter")["bytes"] == 32 * 2**20
    assert {a.key: a.value for a in rep.assumptions}["model"] == "llama-2-7b"


def test_bare_engine_stats_dict_is_accepted(tmp_path):
    engine = EngineStats(model="llama-3-8b", device="cuda", completion_tokens=5_000, steps=500, wall_seconds=2.0,
                         slot_loads=10, slot_hits=30)
    (tmp_path / "e.json").write_text(json.dumps(engine.to_dict()))
    sl = compute(Scenario(tenants=10, model="llama-3-8b", stats=str(tmp_path / "e.json"))).section("slots")
    assert sl["step_seconds"] == pytest.approx(2.0 / 500) and sl["measured_hit_rate"] == pytest.approx(0.75)
