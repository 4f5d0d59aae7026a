"""The default GPU slot count (engine/slot_budget.py): slot and weight bytes against a real model's tensors, the
rule at real GPU sizes, and that `multilora run` keeps the small default on CPU and --max-loras wins."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.engine.slot_budget import (
    CPU_MAX_LORAS,
    MAX_AUTO_LORAS,
    auto_max_loras,
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


@pytest.mark.parametrize(
    "n, gpu_gb, rank, want",
    [
        (64, 141, 16, 64),  # H200: every adapter gets a slot
        (64, 80, 16, 64),  # H100: (72 - 16 GB) x 10% = 5.6 GB = 66 slots of 84 MB
        (300, 141, 16, MAX_AUTO_LORAS),  # capped
        (64, 80, 64, 16),  # rank 64 slots are 336 MB
        (64, 24, 16, 6),  # 24 GB card: 5.6 GB spare, 10% of it
        (3, 80, 16, 3),  # never more than the adapters
        (0, 80, 16, 1),
        (64, 16, 16, 1),  # the weights alone overfill the GPU: still one slot (the engine then reports the KV error)
    ],
)
def test_gpu_rule(n, gpu_gb, rank, want):
    spare = int(gpu_gb * GB * 0.9) - weight_bytes(LLAMA3_8B, 2)
    assert auto_max_loras(n, slot_bytes(LLAMA3_8B, rank, 2), spare) == want


def test_cpu_rule():
    assert [auto_max_loras(n, 1, None) for n in (0, 1, 5, 8, 100)] == [1, 1, 5, CPU_MAX_LORAS, CPU_MAX_LORAS]
    if not torch.cuda.is_available():
        assert spare_gpu_bytes("auto", LLAMA3_8B, 2, 0.9) is None
    assert spare_gpu_bytes("cpu", LLAMA3_8B, 2, 0.9) is None


def test_a_run_picks_the_gpu_default_unless_told(monkeypatch):
    """The run's choice (run/setup.max_loras): the memory query is faked, as this machine has no GPU."""
    from types import SimpleNamespace

    from multilora_cli.engine import slot_budget
    from multilora_cli.run.config import EngineFlags, RunConfig
    from multilora_cli.run.setup import max_loras

    pf = SimpleNamespace(max_loras=CPU_MAX_LORAS, max_lora_rank=16, model_config=LLAMA3_8B)
    asked = []

    def fake_spare(device, config, itemsize, utilization, fp8=False):
        asked.append((device, itemsize, utilization))
        return None if device == "cpu" else int(141 * GB * utilization) - weight_bytes(config, itemsize, fp8)

    monkeypatch.setattr(slot_budget, "spare_gpu_bytes", fake_spare)
    run = RunConfig("in.jsonl", adapters=["x"], engine=EngineFlags(gpu_memory_utilization=0.5))
    assert max_loras(run, pf, 40) == 40 and asked[-1] == ("auto", 2, 0.5)
    assert max_loras(run, pf, 400) == MAX_AUTO_LORAS
    assert max_loras(RunConfig("in.jsonl", adapters=["x"], engine=EngineFlags(device="cpu")), pf, 40) == CPU_MAX_LORAS
    told = RunConfig("in.jsonl", adapters=["x"], max_loras=5)
    assert max_loras(told, SimpleNamespace(max_loras=5), 40) == 5  # --max-loras: no query at all
    assert len(asked) == 3
