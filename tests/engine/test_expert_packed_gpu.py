"""Packed expert-LoRA slot loads on CUDA (page-locked arena block -> one copy on the load stream -> one scatter
launch): the slots hold exactly what the part-by-part path writes, through eviction and reload, both checkpoint
layouts; the engine on CUDA loads MoE adapters packed (run through the device tool; skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.adapters.peft import load_adapter
from multilora_cli.config import EngineConfig
from multilora_cli.engine.direct_read import read_packed
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.expert_slots import ExpertSlots
from multilora_cli.engine.packed import PackedAdapter
from multilora_cli.engine.pinned import PinnedArena
from multilora_cli.engine.slot_writer import SlotWriter
from multilora_cli.kernels.expert_weights import ExpertLoraWeights
from tests.engine.test_expert_packed import ARCH, MAX_RANK, _drop_experts, _live, _state
from tests.models.moe_builders import build_module_adapter, build_moe_base, build_param_adapter
from tests.models.test_moe import EXPERTS, _adapters, _prompts, _requests

pytestmark = pytest.mark.gpu


def test_cuda_packed_slots_equal_part_by_part(tmp_path):
    from multilora_cli.models.config import ModelConfig

    base = build_moe_base(tmp_path / "base", ARCH)
    mc = ModelConfig.from_dir(base)
    paths = {
        "param": build_param_adapter(base, tmp_path / "param", params=EXPERTS, r=4),
        "param_r2": build_param_adapter(base, tmp_path / "param_r2", params=EXPERTS[1:], r=2, seed=5),
        "partial": _drop_experts(build_module_adapter(base, tmp_path / "partial", ARCH, r=8, seed=7), {0, 3}),
    }
    dev = torch.device("cuda")
    moe = mc.moe

    def make():
        return {
            layer: ExpertLoraWeights.empty(
                3, MAX_RANK, moe.num_experts, mc.hidden_size, moe.intermediate_size, torch.float32, dev
            )
            for layer in moe.sparse_layers
        }

    got_slots, ref_slots = make(), make()
    writer = SlotWriter({}, dev, ExpertSlots(got_slots, dev))
    ref = ExpertSlots(ref_slots, dev)
    arena = PinnedArena(64 << 20, cuda=True)
    seq = [(0, "param"), (1, "partial"), (0, "partial"), (2, "param_r2"), (0, "param"), (1, "param"), (0, "param")]
    for slot, which in seq:
        packed = read_packed(paths[which], which, mc, torch.float32, arena)
        assert isinstance(packed, PackedAdapter)
        writer.clear(slot)
        writer.install(slot, packed)
        ref.install_tensors(slot, load_adapter(paths[which], which, mc, dtype=torch.float32).experts)
        torch.cuda.synchronize()
        for got, want in zip(_live(got_slots, slot), _live(ref_slots, slot)):
            assert torch.equal(got, want), (slot, which)
    assert len(writer._plans) == 3  # one scatter plan per layout, whatever the slot
    writer.experts._written[2] = None  # force the zeroing load: then every value equals set_slot's
    writer.install(2, read_packed(paths["partial"], "p", mc, torch.float32, arena))
    ref.install_tensors(2, load_adapter(paths["partial"], "p", mc, dtype=torch.float32).experts)
    torch.cuda.synchronize()
    for got, want in zip(_state(got_slots, 2), _state(ref_slots, 2)):
        assert torch.equal(got, want)


def test_engine_on_cuda_loads_moe_adapters_packed(tmp_path):
    base = build_moe_base(tmp_path / "base", ARCH)
    adapters = _adapters(tmp_path, base)
    cfg = EngineConfig(model=str(base), device="cuda", dtype="float32", max_loras=2, max_lora_rank=8, num_kv_blocks=64)
    engine = Engine(cfg, adapters)
    try:
        assert engine.arena is not None  # MoE adapters live in the page-locked arena like dense ones
        assert all(isinstance(engine._load_cpu(n), PackedAdapter) for n in adapters)
        plan = ["experts", "attn", "both", "all", "experts"]
        got = engine.generate_all(_requests(_prompts(len(plan)), plan))
        assert [r.error for r in got] == [None] * len(plan)
    finally:
        engine.close()
