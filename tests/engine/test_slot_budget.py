"""The default GPU slot count (engine/slot_budget.py): slot and weight bytes against a real model's tensors, the
rule at real GPU sizes (memory, KV reserve, distinct adapters), and that `multilora run` keeps the small default
on CPU, states its choice in the stats, and --max-loras wins."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.engine.slot_budget import (
    CPU_MAX_LORAS,
    KV_RESERVE_CONTEXT,
    SlotInputs,
    choose_max_loras,
    reserve_context,
    slot_bytes,
    spare_gpu_bytes,
    weight_bytes,
)
from multilora_cli.models.config import ModelConfig
from multilora_cli.models.loader import load_model
from tests.builders import build_base

GB = 10**9
LLAMA3_8B = ModelConfig(
    model_type="llama",
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
)


@pytest.mark.parametrize("arch, overrides", [("llama", {}), ("qwen3", {}), ("llama-tied", {"num_key_value_heads": 1})])
def test_bytes_match_the_tensors_the_engine_allocates(tmp_path, arch, overrides):
    base = build_base(tmp_path / arch, arch, **overrides)
    cfg = ModelConfig.from_dir(base)
    model = load_model(base, cfg, dtype=torch.float32, device="cpu", max_loras=3, max_lora_rank=8)
    lora = sum(m.lora.a.numel() + m.lora.b.numel() for m in model.lora_modules().values())
    assert slot_bytes(cfg, 8, 4) == lora * 4 // 3
    plain = load_model(base, cfg, dtype=torch.float32, device="cpu", max_loras=0, max_lora_rank=0)
    matrices = sum(p.numel() for p in plain.parameters() if p.dim() == 2)
    assert weight_bytes(cfg, 4) == matrices * 4


def test_llama3_8b_sizes():
    assert slot_bytes(LLAMA3_8B, 16, 2) == 83_886_080  # 84 MB: rank 16 on all 7 projections, bf16
    assert weight_bytes(LLAMA3_8B, 2) == pytest.approx(16.06 * GB, rel=1e-3)


LLAMA32_1B = ModelConfig(
    model_type="llama",
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    tie_word_embeddings=True,
)


def rule(cfg, n, gpu_gb, rank=16, seqs=256, context=KV_RESERVE_CONTEXT):
    spare = int(gpu_gb * GB * 0.9) - weight_bytes(cfg, 2)
    x = SlotInputs(n, slot_bytes(cfg, rank, 2), spare, seqs, context, cfg.kv_bytes_per_token(2))
    return choose_max_loras(x)


@pytest.mark.parametrize(
    "cfg, n, gpu_gb, rank, seqs, context, want",
    [
        # Llama-3.2-1B (22.5 MB slots): 1,000 adapters all get a slot on an H100 (issue 38: 64 capped the batch)
        (LLAMA32_1B, 1000, 80, 16, 256, 2048, 1000),
        (LLAMA32_1B, 3, 80, 16, 256, 2048, 3),  # never more than the adapters
        (LLAMA32_1B, 0, 80, 16, 256, 2048, 1),
        # Llama-3-8B (84 MB slots), H200: (126.9 - 16.06 - 256 x 256 x 128 KiB = 8.6 GB) / 2 = 51 GB -> 609
        (LLAMA3_8B, 1000, 141, 16, 256, 256, 609),
        (LLAMA3_8B, 1000, 141, 16, 256, 2048, 251),  # a 68.7 GB reserve leaves 42 GB: half of it
        # H100 at 2048 tokens: the reserve overfills the 55.9 GB beside the weights: the 10% floor, 5.6 GB
        (LLAMA3_8B, 1000, 80, 16, 256, 2048, 66),
        (LLAMA3_8B, 1000, 80, 64, 256, 2048, 16),  # rank 64 slots are 336 MB
        (LLAMA3_8B, 64, 24, 16, 256, 2048, 6),  # 24 GB card: 5.6 GB spare, the 10% floor
        (LLAMA3_8B, 64, 16, 16, 256, 2048, 1),  # the weights alone overfill the GPU: still one slot
    ],
)
def test_gpu_rule(cfg, n, gpu_gb, rank, seqs, context, want):
    choice = rule(cfg, n, gpu_gb, rank, seqs, context)
    assert choice.max_loras == want
    assert f"{n} adapters" in choice.reason and f"{seqs} seqs x {context} tokens" in choice.reason


def test_more_sequences_or_context_leave_fewer_slots():
    counts = [
        rule(LLAMA3_8B, 10_000, 141, seqs=s, context=c).max_loras for s, c in ((64, 512), (256, 512), (256, 1024))
    ]
    assert counts[0] > counts[1] > counts[2] >= 66


def test_reserve_context_caps_at_the_stated_length():
    assert reserve_context(None, 131072) == KV_RESERVE_CONTEXT
    assert reserve_context(256, 131072) == 256
    assert reserve_context(None, 1024) == 1024


def test_given_wins_and_cpu_stays_small():
    assert choose_max_loras(SlotInputs(1000, 1, 10**12), given=5).max_loras == 5
    assert choose_max_loras(SlotInputs(1000, 1, 10**12), given=5).reason == "--max-loras 5"
    cpu = [choose_max_loras(SlotInputs(n, 1, None)).max_loras for n in (0, 1, 5, 8, 100)]
    assert cpu == [1, 1, 5, CPU_MAX_LORAS, CPU_MAX_LORAS]
    assert "CPU" in choose_max_loras(SlotInputs(100, 1, None)).reason


def test_cpu_rule():
    if not torch.cuda.is_available():
        assert spare_gpu_bytes("auto", LLAMA3_8B, 2, 0.9) is None
    assert spare_gpu_bytes("cpu", LLAMA3_8B, 2, 0.9) is None


def test_a_run_picks_the_gpu_default_unless_told(monkeypatch):
    """The run's choice (run/setup.engine_config): the memory query is faked, as this machine has no GPU."""
    from types import SimpleNamespace

    from multilora_cli.engine import slot_budget
    from multilora_cli.run.config import EngineFlags, RunConfig
    from multilora_cli.run.setup import engine_config

    pf = SimpleNamespace(max_loras=CPU_MAX_LORAS, max_lora_rank=16, model_config=LLAMA3_8B, model_path="/m", scans={})
    asked = []

    def fake_spare(device, config, itemsize, utilization, fp8=False):
        asked.append((device, itemsize, utilization))
        return None if device == "cpu" else int(141 * GB * utilization) - weight_bytes(config, itemsize, fp8)

    monkeypatch.setattr(slot_budget, "spare_gpu_bytes", fake_spare)
    good = lambda n: {f"a{i}": None for i in range(n)}  # noqa: E731
    run = RunConfig("in.jsonl", adapters=["x"], engine=EngineFlags(gpu_memory_utilization=0.9, max_model_len=256))
    econf, choice = engine_config(run, pf, good(40))
    assert econf.max_loras == choice.max_loras == 40 and asked[-1] == ("auto", 2, 0.9)
    assert econf.max_cpu_loras >= 40
    econf, choice = engine_config(run, pf, good(1000))
    assert econf.max_loras == 609 and "256 seqs x 256 tokens" in choice.reason
    fewer = RunConfig("in.jsonl", adapters=["x"], engine=EngineFlags(max_num_seqs=64, max_model_len=256))
    assert engine_config(fewer, pf, good(1000))[0].max_loras > 609  # a smaller KV reserve leaves more
    cpu = RunConfig("in.jsonl", adapters=["x"], engine=EngineFlags(device="cpu"))
    assert engine_config(cpu, pf, good(40))[0].max_loras == CPU_MAX_LORAS
    told = RunConfig("in.jsonl", adapters=["x"], max_loras=5)
    econf, choice = engine_config(told, SimpleNamespace(**{**vars(pf), "max_loras": 5}), good(40))
    assert econf.max_loras == 5 and choice.reason == "--max-loras 5"  # --max-loras: no memory query at all
    assert len(asked) == 4


def test_a_bounded_kv_need_gives_slots_the_memory_it_cannot_use():
    """Issue 37: Qwen3-30B-A3B shapes on an H200, 64 adapters of 1.69 GB, 256 sequences of 256 tokens: the KV
    cache can never use more than its cap, so the slots take what is past it (and the staging buffers, and the
    headroom), not half of what is left after the reserve."""
    from multilora_cli.economics.presets import MODEL_PRESETS
    from multilora_cli.engine.runner_sizing import staging_buffers
    from multilora_cli.engine.slot_budget import KV_CAP_HEADROOM

    cfg = ModelConfig.from_dict(dict(MODEL_PRESETS["qwen3-30b-a3b"]))
    spare = int(141 * GB * 0.9) - weight_bytes(cfg, 2)
    one, kv = slot_bytes(cfg, 16, 2), cfg.kv_bytes_per_token(2)
    cap = 256 * 17 * 16 * kv
    plain = choose_max_loras(SlotInputs(64, one, spare, 256, 256, kv)).max_loras
    assert plain == int(0.5 * (spare - 256 * 256 * kv) // one)  # half of what the reserve leaves
    capped = choose_max_loras(SlotInputs(64, one, spare, 256, 256, kv, kv_cap=cap))
    rest = (1 - KV_CAP_HEADROOM) * spare - cap - staging_buffers(one) * one
    assert capped.max_loras == int(rest // one) > plain and "past the" in capped.reason
    # a cap above what half would leave changes nothing, nor do more slots than adapters
    assert choose_max_loras(SlotInputs(64, one, spare, 256, 256, kv, kv_cap=spare)).max_loras == plain
    assert choose_max_loras(SlotInputs(8, one, spare, 256, 256, kv, kv_cap=cap)).max_loras == 8
