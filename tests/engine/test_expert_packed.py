"""Packed expert-LoRA loads (engine/packed_experts.py, expert_slots.py): the checkpoint read straight into one buffer
(both layouts: PEFT target_parameters and per-expert modules, one with experts left out) is bit-identical to
pack_adapter(load_adapter(...)); installed by SlotWriter (foreach on CPU; the scatter plan under the Triton
interpreter) the slots hold exactly what the part-by-part path writes, through eviction and reload of adapters
with other ranks; and an engine whose loads are packed gives HF + PEFT's tokens."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from multilora_cli.adapters.peft import load_adapter
from multilora_cli.config import EngineConfig
from multilora_cli.engine.direct_read import read_packed
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.expert_slots import ExpertSlots
from multilora_cli.engine.packed import PackedAdapter, pack_adapter
from multilora_cli.engine.pinned import PinnedArena
from multilora_cli.engine.slot_writer import SlotWriter
from multilora_cli.errors import AdapterError
from multilora_cli.kernels.expert_weights import ExpertLoraWeights
from multilora_cli.kernels.scatter import scatter_blocks, scatter_plan
from multilora_cli.models.config import ModelConfig
from tests.devices import needs_interpreter
from tests.models.moe_builders import build_module_adapter, build_moe_base, build_param_adapter
from tests.models.test_moe import EXPERTS, _adapters, _check, _hf, _prompts, _requests

ARCH = "qwen3_moe"
MAX_RANK = 8


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("expert_packed")
    base = build_moe_base(root / "base", ARCH)
    out = {
        "param": build_param_adapter(base, root / "param", targets=("q_proj", "o_proj"), params=EXPERTS, r=4),
        "param_e": build_param_adapter(base, root / "param_e", params=EXPERTS, r=4, alpha=4, seed=4),
        "param_r2": build_param_adapter(base, root / "param_r2", params=EXPERTS[1:], r=2, alpha=6, seed=5),
        "module": build_module_adapter(base, root / "module", ARCH, r=4, layers=(0, 1)),
        "partial": _drop_experts(build_module_adapter(base, root / "partial", ARCH, r=8, seed=7), {1, 4}),
    }
    return base, ModelConfig.from_dir(base), out


def _drop_experts(path, experts: set[int]):
    """A per-expert-module adapter that leaves `experts` out (not adapted)."""
    f = path / "adapter_model.safetensors"
    t = load_file(str(f))
    save_file({k: v for k, v in t.items() if not any(f".experts.{e}." in k for e in experts)}, str(f))
    return path


def _slots(mc: ModelConfig, max_loras=2):
    moe = mc.moe
    return {
        layer: ExpertLoraWeights.empty(
            max_loras, MAX_RANK, moe.num_experts, mc.hidden_size, moe.intermediate_size, torch.float32, "cpu"
        )
        for layer in moe.sparse_layers
    }


def _state(slots: dict[int, ExpertLoraWeights], slot: int):
    return [t[slot].clone() for w in slots.values() for t in (w.gu_a, w.gu_b, w.gu_scale, w.dn_a, w.dn_b, w.dn_scale)]


def _live(slots, slot):
    """What a slot's kernels read: A / B where the rank rows say, scale and rank rows (values past them are
    stale by design after an eviction)."""
    out = []
    for w in slots.values():
        out += [w.rank[slot].clone(), w.shared[slot].clone(), w.gu_scale[slot].clone(), w.dn_scale[slot].clone()]
        out += [(w.gu_a[slot] * w.gu_scale[slot][None, :, None] != 0).float() * w.gu_a[slot]]
        R, inter = w.max_rank, w.dn_a.shape[3]
        live_g, live_u = (w.gu_scale[slot][:R] != 0), (w.gu_scale[slot][R:] != 0)  # gate rows | up rows of gu_b
        out += [torch.cat([w.gu_b[slot][:, :inter] * live_g, w.gu_b[slot][:, inter:] * live_u], dim=1)]
        out += [w.dn_b[slot] * (w.dn_scale[slot] != 0)]
    return out


def _read(path, mc, name="x"):
    arena = PinnedArena(64 << 20, cuda=False)
    packed = read_packed(path, name, mc, torch.float32, arena)
    assert isinstance(packed, PackedAdapter)
    return packed


@pytest.mark.parametrize("which", ["param", "param_r2", "module", "partial"])
def test_direct_read_is_pack_of_load(ckpts, which):
    _, mc, paths = ckpts
    packed = _read(paths[which], mc)
    ref = pack_adapter(load_adapter(paths[which], "x", mc, dtype=torch.float32), pin=False)
    assert packed.layout == ref.layout
    assert torch.equal(packed.flat, ref.flat)
    loaded = load_adapter(paths[which], "x", mc, dtype=torch.float32).experts
    assert set(packed.experts) == set(loaded)
    for k, (a, b, s) in loaded.items():  # the packed views are the adapter's experts, layout for layout
        pa, pb, ps = packed.experts[k]
        assert torch.equal(pa, a) and torch.equal(pb, b) and ps == s
    assert packed.max_rank == ref.max_rank and packed.num_params == load_adapter(paths[which], "x", mc).num_params


def test_peft_gate_up_share_one_a(ckpts):
    _, mc, paths = ckpts
    plan = _read(paths["param"], mc).plan
    by = {(p.layer, p.part): p for p in plan.experts}
    assert by[(0, "gate")].a_off == by[(0, "up")].a_off and by[(0, "gate")].peft_b
    assert by[(0, "up")].b_off == by[(0, "gate")].b_off + by[(0, "gate")].b_numel  # lora_B rows back to back
    assert not by[(0, "gate")].a_off == by[(0, "down")].a_off


def _with_value(src, dst, ab: str, index: tuple[int, int], value: float):
    """A copy of the param adapter `src` whose layer-1 expert lora_`ab` holds `value` at `index`."""
    dst.mkdir()
    (dst / "adapter_config.json").write_text((src / "adapter_config.json").read_text())
    t = load_file(str(src / "adapter_model.safetensors"))
    key = next(k for k in t if "layers.1.mlp.experts" in k and f"lora_{ab}" in k)
    t[key][index] = value
    save_file(t, str(dst / "adapter_model.safetensors"))
    return dst


def test_nonfinite_expert_named(ckpts, tmp_path):
    _, mc, paths = ckpts
    bad = _with_value(paths["param"], tmp_path / "bad", "B", (0, 0), float("nan"))
    with pytest.raises(AdapterError, match="expert LoRA of layer 1 contains NaN"):
        _read(bad, mc)
    with pytest.raises(AdapterError, match="expert LoRA of layer 1 contains NaN"):
        load_adapter(bad, "x", mc)


def test_packed_slots_equal_part_by_part_with_eviction(ckpts):
    """Slot 0 takes adapters of different layouts and ranks in turn (evicted between), slot 1 keeps one: each load
    leaves the slot exactly as set_slot would (every value, stale ones included, where the layout changed; what
    the kernels read where it did not)."""
    _, mc, paths = ckpts
    packed_slots, ref_slots = _slots(mc), _slots(mc)
    writer = SlotWriter({}, torch.device("cpu"), ExpertSlots(packed_slots, torch.device("cpu")))
    ref = ExpertSlots(ref_slots, torch.device("cpu"))
    seq = [(0, "param_e"), (1, "module"), (0, "partial"), (0, "param_r2"), (0, "param_e"), (0, "param_e")]
    seq += [(1, "partial")]
    for slot, which in seq:
        writer.clear(slot)
        writer.install(slot, _read(paths[which], mc, which))
        ref.install_tensors(slot, load_adapter(paths[which], which, mc, dtype=torch.float32).experts)
        for got, want in zip(_live(packed_slots, slot), _live(ref_slots, slot)):
            assert torch.equal(got, want), (slot, which)
    assert writer.experts.zeroed >= 3  # layouts changed in slot 0 (param_e -> partial -> param_r2 -> param_e), 1
    for slot in (0, 1):  # after a zeroing load, every value equals set_slot's (which clears the slot first)
        writer.clear(slot)
        writer.experts._written[slot] = None
        writer.install(slot, _read(paths["module"], mc))
        ref.install_tensors(slot, load_adapter(paths["module"], "m", mc, dtype=torch.float32).experts)
        for got, want in zip(_state(packed_slots, slot), _state(ref_slots, slot)):
            assert torch.equal(got, want)


@needs_interpreter
@pytest.mark.parametrize("which", ["param_e", "partial"])
def test_scatter_plan_writes_the_expert_views(ckpts, which):
    """The CUDA path's one launch (here under the interpreter): the plan of the expert views, built for slot 0 and
    shifted to slot 1, writes what the foreach copy of the same views writes."""
    _, mc, paths = ckpts
    packed = _read(paths[which], mc)
    slots_a, slots_b = _slots(mc), _slots(mc)
    ea, eb = ExpertSlots(slots_a, torch.device("cpu")), ExpertSlots(slots_b, torch.device("cpu"))
    dst, src, steps = ea.views(0, packed.plan.experts, packed.flat)
    base = next(iter(slots_a.values())).gu_a
    scatter_blocks(packed.flat, base, scatter_plan(dst, src, packed.flat, base, steps), shift=1)
    dst_b, src_b, _ = eb.views(1, packed.plan.experts, packed.flat)
    torch._foreach_copy_(dst_b, src_b)
    for got, want in zip(_state(slots_a, 1), _state(slots_b, 1)):
        assert torch.equal(got, want)
    assert any(t.abs().sum() > 0 for t in _state(slots_a, 1))


class PackedEngine(Engine):
    """The engine as it loads on CUDA (checkpoint -> arena block -> packed slot load), on CPU."""

    def _make_arena(self):
        return PinnedArena(256 << 20, cuda=False), self.config.max_cpu_loras, self.config.max_num_seqs

    def _load_cpu(self, name):
        packed = read_packed(self.adapters[name], name, self.model_config, self.runner.dtype, self.arena)
        assert isinstance(packed, PackedAdapter)
        return self._check_rank(packed)


@pytest.mark.slow
def test_packed_engine_matches_hf_peft_with_eviction(tmp_path):
    base = build_moe_base(tmp_path / "base", ARCH)
    adapters = _adapters(tmp_path, base)
    adapters["module"] = build_module_adapter(base, tmp_path / "module", ARCH)
    _check_packed_engine(base, adapters)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_packed_engine_other_families(tmp_path, arch):
    """Mixtral's per-expert w1/w2/w3 and Qwen2-MoE's shared expert (dense modules packed beside the experts) and
    dense layer: packed loads give HF + PEFT's tokens too."""
    base = build_moe_base(tmp_path / "base", arch)
    adapters = _adapters(tmp_path, base)
    if arch == "mixtral":
        adapters["module"] = build_module_adapter(base, tmp_path / "module", arch)
    plan = ["all", "experts", None, "both", "attn", "all"] + (["module"] if arch == "mixtral" else [])
    prompts = _prompts(len(plan), seed=9)
    cfg = EngineConfig(model=str(base), device="cpu", max_loras=2, max_lora_rank=8, max_num_seqs=2)
    engine = PackedEngine(cfg, adapters)
    _check(engine.generate_all(_requests(prompts, plan)), _hf(base, adapters, prompts, plan))


def _check_packed_engine(base, adapters):
    plan = ["experts", "module", None, "both", "all", "experts", "attn", "module", "both", "all"]
    prompts = _prompts(len(plan), seed=5)
    cfg = EngineConfig(model=str(base), device="cpu", max_loras=2, max_lora_rank=8, max_num_seqs=2)
    engine = PackedEngine(cfg, adapters)
    got = engine.generate_all(_requests(prompts, plan))
    want = _hf(base, adapters, prompts, plan)
    _check(got, want)
    # the offline scheduler runs each adapter's requests together: one load each, though 2 slots hold 5 adapters
    assert engine.slots.adapter_loads == {a: 1 for a in adapters} and engine.slots.evictions == len(adapters) - 2
    again = engine.generate_all(_requests(prompts[::-1], plan[::-1]))  # evicted adapters come back
    _check(again, want[::-1])
    assert max(engine.slots.adapter_loads.values()) == 2 and json.dumps(engine.slots.stats())


def test_full_or_no_arena_reads_into_pageable_memory(ckpts):
    """`pageable=True` (the engine on CUDA): a full arena, or none, gives the same buffer in pageable memory."""
    _, mc, paths = ckpts
    ref = _read(paths["param"], mc)
    full = PinnedArena(1 << 20, cuda=False)
    assert full.alloc(full.nbytes) is not None
    assert read_packed(paths["param"], "x", mc, torch.float32, full) is None
    for arena in (full, None):
        got = read_packed(paths["param"], "x", mc, torch.float32, arena, pageable=True)
        assert got.block is None and got.layout == ref.layout and torch.equal(got.flat, ref.flat)


def test_expert_values_past_float16s_range_refused_in_float16(ckpts, tmp_path):
    """Expert LoRA holding a finite value float16 cannot (1e5): refused by both readers when served in float16,
    naming the layer, and served in bfloat16."""
    _, mc, paths = ckpts
    big = _with_value(paths["param"], tmp_path / "big", "A", (0, 1), 1e5)
    want = "expert LoRA of layer 1 holds values beyond float16's range"
    with pytest.raises(AdapterError, match=want):
        read_packed(big, "x", mc, torch.float16, None, pageable=True)
    with pytest.raises(AdapterError, match=want):
        load_adapter(big, "x", mc, dtype=torch.float16)
    assert read_packed(big, "x", mc, torch.bfloat16, None, pageable=True) is not None
