"""Real inputs: measured run stats, real PEFT adapters, model directories, Hub ids that name a preset."""

from __future__ import annotations

import json
import math

import pytest
from safetensors import safe_open

from multilora_cli.economics import Scenario, compute
from multilora_cli.engine.request import EngineStats
from multilora_cli.errors import AdapterError, InputError, UsageError
from multilora_cli.io.stats import RunStats


def write_stats(path, usd=2.99, **kw):
    """A stats file as `multilora run --stats` writes it (RunStats around the engine's EngineStats), llama-2-7b on
    an H100; `kw` overrides EngineStats fields. Also used by test_economics_cli.py."""
    engine = EngineStats(
        model="meta-llama/Llama-2-7b-hf",
        device="cuda:0 NVIDIA H100 80GB HBM3",
        dtype="bfloat16",
        requests=400,
        completion_tokens=102_400,
        prompt_tokens=40_000,
        steps=2_000,
        wall_seconds=40.0,
        slot_loads=300,
        slot_hits=100,
        max_loras=8,
    )
    for k, v in kw.items():
        setattr(engine, k, v)
    run = RunStats()
    for _ in range(400):
        run.add_ok("a", 100, 256)
    path.write_text(json.dumps(run.to_dict(engine=engine.to_dict(), wall_seconds=55.0, gpu_hour_usd=usd)))
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
    (w,) = rep.warnings
    assert "tiny-llama" in w and "cpu is not a CUDA GPU" in w and "sizing from the roofline" in w
    a100 = write_stats(tmp_path / "a.json", device="cuda:0 NVIDIA A100-SXM4-80GB")
    assert any("A100" in w for w in compute(Scenario(tenants=10, stats=str(a100))).warnings)
    assert not compute(Scenario(tenants=10, stats=str(a100), gpu="a100-80gb")).warnings


def _sized_by(rep) -> tuple[float, float]:
    """(tok/s that sized the shared fleet, the roofline's)."""
    th = rep.section("throughput")
    return th["tokens_per_s"], th["tokens_per_s_roofline"]


@pytest.mark.parametrize(
    "kw,gpu,used,needle",
    [
        ({}, "h100-sxm", True, None),
        ({"device": "cpu"}, "h100-sxm", False, "cpu is not a CUDA GPU"),
        ({"device": "mps"}, "h100-sxm", False, "mps is not a CUDA GPU"),
        ({"device": ""}, "h100-sxm", False, "the stats name no device"),
        ({"device": "cuda:0 NVIDIA A100-SXM4-80GB"}, "h100-sxm", False, "is not a h100-sxm"),
        ({"device": "cuda:0 NVIDIA A100-SXM4-80GB"}, "a100-80gb", True, None),
        ({"device": "cuda:0 NVIDIA A100-SXM4-80GB"}, "a100-40gb", False, "a100 80gb, not a a100-40gb"),
        ({"device": "cuda:0 NVIDIA H200"}, "h100-sxm", False, "is not a h100-sxm"),
        ({"device": "cuda:0 NVIDIA H200"}, "h200", True, None),
        ({"device": "cuda:0 NVIDIA H100 PCIe"}, "h100-sxm", False, "h100 PCIe, not a h100-sxm"),
        ({"device": "NVIDIA L40S"}, "l40s", True, None),
        ({"device": "cuda:0 NVIDIA GeForce RTX 4090"}, "h100-sxm", False, "is not a h100-sxm"),
        ({"device": "cuda:0"}, "h100-sxm", True, "does not name its GPU"),  # stats of older versions
        ({"device": "cuda:0 (NVIDIA H100 80GB HBM3)"}, "h100-sxm", True, None),  # engine.device_label's form
        ({"device": "cuda:0 (NVIDIA H200)"}, "h100-sxm", False, "is not a h100-sxm"),
        ({"dtype": "float32"}, "h100-sxm", False, "float32 weights, not bfloat16"),
        ({"dtype": "float16"}, "h100-sxm", True, None),  # same bytes per parameter
        ({"model": "meta-llama/Meta-Llama-3-8B"}, "h100-sxm", False, "another model shape"),
        ({"model": "/models/llama-2-7b"}, "h100-sxm", True, None),  # a preset's folder name
        ({"model": "/models/Llama-2-7b-hf"}, "h100-sxm", True, None),  # the preset's Hub name, elsewhere
        ({"model": "/models/llama-2-70b"}, "h100-sxm", False, "'llama-2-70b' is another name"),
        ({"model": ""}, "h100-sxm", False, "the stats name no model"),
    ],
)
def test_measured_throughput_sizes_only_a_comparable_run(tmp_path, kw, gpu, used, needle):
    stats = write_stats(tmp_path / "s.json", **kw)
    rep = compute(Scenario(tenants=100, model="llama-2-7b", gpu=gpu, stats=str(stats)))
    sized, roof = _sized_by(rep)
    th, sl = rep.section("throughput"), rep.section("slots")
    assert th["measured_used_for_sizing"] is used
    assert sized == (pytest.approx(102_400 / 40.0) if used else roof)
    assert ("measured" in {f.key: f.how for f in sl.figures}["step_seconds"]) is used
    assert sl["measured_hit_rate"] == pytest.approx(0.25)  # hardware-free figures are kept either way
    assert {a.key: a for a in rep.assumptions}["output_tokens"].source == "measured"
    if needle is None:
        assert not rep.warnings
    else:
        (w,) = rep.warnings
        assert needle in w and w.startswith("--stats: ") and "\n" not in w, w
        assert ("sizing from the roofline" in w) is not used


def test_stats_model_directory_is_compared_by_shape(tmp_path, tiny):
    # the demo's case: `multilora run --stats` on a tiny CPU model, then economics for llama-2-7b
    stats = write_stats(tmp_path / "s.json", model=str(tiny["base"]), device="cpu", dtype="float32")
    rep = compute(Scenario(tenants=100, stats=str(stats)))
    (w,) = rep.warnings
    assert "another model shape (layers 2 vs 32, hidden 64 vs 4096" in w and "cpu is not a CUDA GPU" in w
    assert "measured_vs_roofline" not in rep.to_dict()["throughput"]  # against another model's roofline: no
    gpu = write_stats(tmp_path / "g.json", model=str(tiny["base"]), device="cuda:0 NVIDIA H100 80GB HBM3")
    same = compute(Scenario(tenants=3, model=str(tiny["base"]), stats=str(gpu)))
    assert same.section("throughput")["measured_used_for_sizing"] is True and not same.warnings


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


def test_dora_adapter_counts_its_magnitudes(tiny, tmp_path):
    """economics --adapter on a DoRA adapter: its magnitudes count in the adapter's bytes (PEFT's own parameter
    count of lora_A, lora_B and lora_magnitude_vector), and each GPU slot carries the float32 scale rows."""
    import peft
    import transformers as tf

    from multilora_cli.adapters.costs import dora_slot_bytes
    from multilora_cli.models.config import ModelConfig
    from tests.builders import build_adapter

    path = build_adapter(tiny["base"], tmp_path / "dora", r=8, targets=("q_proj", "v_proj"), use_dora=True)
    rep = compute(Scenario(tenants=5, adapter=str(path), max_loras=4))
    plain = compute(Scenario(tenants=5, adapter=str(tiny["qv"]), max_loras=4))
    a = rep.section("adapter")
    assert a["dora_params"] == 2 * (64 + 32)  # q 64 + v 32 output features, 2 layers
    model = peft.PeftModel.from_pretrained(tf.AutoModelForCausalLM.from_pretrained(tiny["base"]), path)
    assert a["params"] + a["dora_params"] == sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert a["bytes"] == 2 * (a["params"] + a["dora_params"])
    extra = 4 * dora_slot_bytes(ModelConfig.from_dir(tiny["base"]))
    assert rep.section("memory")["slot_bytes"] == plain.section("memory")["slot_bytes"] + extra > extra


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
    engine = EngineStats(
        model="llama-3-8b",
        device="cuda",
        completion_tokens=5_000,
        steps=500,
        wall_seconds=2.0,
        slot_loads=10,
        slot_hits=30,
    )
    (tmp_path / "e.json").write_text(json.dumps(engine.to_dict()))
    sl = compute(Scenario(tenants=10, model="llama-3-8b", stats=str(tmp_path / "e.json"))).section("slots")
    assert sl["step_seconds"] == pytest.approx(2.0 / 500) and sl["measured_hit_rate"] == pytest.approx(0.75)


def test_measured_tokens_per_request_leave_error_records_out(tmp_path):
    # 400 requests generated 256 tokens each; 400 more lines were error records (no tokens, never decoded).
    # The mean counted them: 128 tokens per request, doubling the new requests per step.
    engine = EngineStats(
        model="meta-llama/Llama-2-7b-hf",
        device="cuda:0 (NVIDIA H100 80GB HBM3)",
        dtype="bfloat16",
        requests=800,
        errors=400,
        completion_tokens=102_400,
        steps=2_000,
        wall_seconds=40.0,
    )
    run = RunStats()
    for _ in range(400):
        run.add_ok("a", 100, 256)
        run.add_error("a", "invalid_request")
    (tmp_path / "s.json").write_text(json.dumps(run.to_dict(engine=engine.to_dict(), wall_seconds=55.0)))
    (tmp_path / "e.json").write_text(json.dumps(engine.to_dict()))  # the engine's own dict counts errors too
    for name in ("s.json", "e.json"):
        rep = compute(Scenario(tenants=100, model="llama-2-7b", stats=str(tmp_path / name)))
        out = {a.key: a for a in rep.assumptions}["output_tokens"]
        assert (out.value, out.source) == (256, "measured"), name


def test_data_parallel_stats_size_one_replica_per_worker(tmp_path):
    # `multilora run --data-parallel 2 --stats`: tokens/s are both GPUs' and steps both workers'. Read as one
    # replica's, they halved the shared fleet and its step time.
    path = write_stats(tmp_path / "dp.json", device="2 x cuda:0 (NVIDIA H100 80GB HBM3)")
    data = json.loads(path.read_text())
    data["data_parallel"] = data["engine"]["data_parallel"] = {"world_size": 2, "workers": [{}, {}]}
    path.write_text(json.dumps(data))
    rep = compute(Scenario(tenants=100, model="llama-2-7b", stats=str(path)))
    th, sl = rep.section("throughput"), rep.section("slots")
    assert th["measured_used_for_sizing"] is True and not rep.warnings
    assert th["tokens_per_s_measured"] == th["tokens_per_s"] == pytest.approx(102_400 / 40.0 / 2)
    assert "2 data-parallel workers" in {f.key: f.how for f in th.figures}["tokens_per_s_measured"]
    assert rep.section("fleet")["shared_replicas_by_throughput"] == math.ceil(100 * 50 / (102_400 / 40.0 / 2))
    assert sl["step_seconds"] == pytest.approx(40.0 / (2000 / 2))  # each worker ran half the steps
    assert sl["measured_loads_per_step"] == pytest.approx(300 / 2000)  # summed loads over summed steps
    data["data_parallel"]["world_size"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="world_size must be a positive whole number"):
        compute(Scenario(tenants=100, model="llama-2-7b", stats=str(path)))


def test_vocab_adapters_count_their_lora_and_copies(tiny, tmp_path):
    """economics --adapter: LoRA on lm_head is a module row (H -> V) in the adapter's params and slots; a
    modules_to_save copy of lm_head counts V x H in the adapter's bytes and in every GPU slot."""
    from multilora_cli.models.config import ModelConfig
    from tests.builders import build_adapter

    cfg = ModelConfig.from_dir(tiny["base"])
    vh = cfg.vocab_size * cfg.hidden_size
    head = build_adapter(tiny["base"], tmp_path / "head", r=8, targets=("q_proj", "v_proj", "lm_head"))
    rep = compute(Scenario(tenants=5, adapter=str(head), max_loras=4))
    plain = compute(Scenario(tenants=5, adapter=str(tiny["qv"]), max_loras=4))
    assert ("lm_head", 8, 1) in [(m["module"], m["rank"], m["layers"]) for m in rep.modules]
    lora = 8 * (cfg.hidden_size + cfg.vocab_size)
    assert rep.section("adapter")["params"] == plain.section("adapter")["params"] + lora
    assert rep.section("memory")["slot_bytes"] == plain.section("memory")["slot_bytes"] + 4 * 2 * lora
    mts = build_adapter(tiny["base"], tmp_path / "mts", r=8, targets=("q_proj", "v_proj"), modules_to_save=["lm_head"])
    rep = compute(Scenario(tenants=5, adapter=str(mts), max_loras=4))
    a = rep.section("adapter")
    assert a["full_params"] == vh and a["bytes"] == 2 * (a["params"] + vh)
    assert rep.section("memory")["slot_bytes"] == plain.section("memory")["slot_bytes"] + 4 * 2 * vh
