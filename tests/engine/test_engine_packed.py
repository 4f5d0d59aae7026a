"""pack_adapter + SlotWriter's packed path: the slots hold exactly what the tensor-by-tensor path writes."""

import os

import pytest
import torch

from multilora_cli.adapters.peft import LoraAdapter, LoraModule
from multilora_cli.engine.packed import PackedAdapter, pack_adapter
from multilora_cli.engine.slot_writer import SlotWriter
from multilora_cli.layers.lora import LoRALinear

H, I, Q, KV = 32, 48, 32, 16
SHAPES = {
    "q_proj": (H, Q),
    "k_proj": (H, KV),
    "v_proj": (H, KV),
    "o_proj": (Q, H),
    "gate_proj": (H, I),
    "up_proj": (H, I),
    "down_proj": (I, H),
}


def _modules(layers=2, max_loras=3, max_rank=8):
    torch.manual_seed(0)
    mods = {}
    for layer in range(layers):
        mods[(layer, "qkv_proj")] = LoRALinear(H, [Q, KV, KV], max_loras=max_loras, max_rank=max_rank)
        mods[(layer, "o_proj")] = LoRALinear(Q, [H], max_loras=max_loras, max_rank=max_rank)
        mods[(layer, "gate_up_proj")] = LoRALinear(H, [I, I], max_loras=max_loras, max_rank=max_rank)
        mods[(layer, "down_proj")] = LoRALinear(I, [H], max_loras=max_loras, max_rank=max_rank)
    return mods


def _adapter(name, ranks, layers=2, seed=1):
    """ranks: PEFT module name -> rank (missing = not adapted)."""
    g = torch.Generator().manual_seed(seed)
    modules = {}
    for layer in range(layers):
        for mod, r in ranks.items():
            fin, fout = SHAPES[mod]
            modules[(layer, mod)] = LoraModule(
                a=torch.randn(r, fin, generator=g), b=torch.randn(fout, r, generator=g), scaling=2.0 + layer + r / 10
            )
    return LoraAdapter(
        name=name,
        path=None,
        config=None,
        modules=modules,
        base_model=None,
        weights_path=None,
        stored_dtype=torch.float32,
        stored_nbytes=0,
    )


def _state(mods, slot):
    return [
        (m.lora.a[slot].clone(), m.lora.b[slot].clone(), m.lora.rank[slot].clone(), m.lora.scale[slot].clone())
        for m in mods.values()
    ]


def test_packed_install_matches_tensor_path():
    uniform = _adapter("u", {m: 8 for m in SHAPES})  # every fused module uniform at the pool's max rank
    mixed = _adapter("m", {"q_proj": 4, "v_proj": 8, "o_proj": 2, "gate_proj": 4, "up_proj": 6}, seed=2)
    for adapter in (uniform, mixed):
        plain, packed = _modules(), _modules()
        # stale contents in the slot first: the packed path must overwrite what it adapts, zero the ranks it skips
        SlotWriter(plain, torch.device("cpu")).install(1, uniform)
        SlotWriter(packed, torch.device("cpu")).install(1, uniform)
        SlotWriter(plain, torch.device("cpu")).install(1, adapter)
        p = pack_adapter(adapter, pin=False)
        assert isinstance(p, PackedAdapter) and p.flat.numel() == sum(
            m.a.numel() + m.b.numel() for m in adapter.modules.values()
        )
        for key, m in adapter.modules.items():  # the packed adapter is still the same adapter
            assert torch.equal(p.modules[key].a, m.a) and torch.equal(p.modules[key].b, m.b)
        SlotWriter(packed, torch.device("cpu")).install(1, p)
        for (a0, b0, r0, s0), (a1, b1, r1, s1) in zip(_state(plain, 1), _state(packed, 1)):
            assert torch.equal(r0, r1) and torch.equal(s0, s1)
            for i, r in enumerate(r0.tolist()):  # rows past the rank are never read
                assert torch.equal(a0[i, :r], a1[i, :r])
            rmax = int(r0.max())
            assert torch.equal(b0[:, :rmax], b1[:, :rmax]) or rmax == 0
        assert all(torch.equal(x[0], y[0]) for x, y in zip(_state(plain, 0), _state(packed, 0)))  # other slots


def test_packed_install_rejects_a_bigger_rank():
    mods = _modules(max_rank=4)
    p = pack_adapter(_adapter("big", {"o_proj": 8}), pin=False)
    try:
        SlotWriter(mods, torch.device("cpu")).install(0, p)
    except ValueError as e:
        assert "o_proj" in str(e)
    else:
        raise AssertionError("rank 8 into a rank-4 pool was accepted")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton scatter on CPU tensors: interpreter")
def test_cached_plans_serve_every_slot_and_buffer(monkeypatch):
    """The CUDA path, run on CPU tensors (same code; only the pinned staging of rank/scale rows is swapped for
    plain tensors) through the staging buffer and through two device-staging buffers, many loads, each slot
    checked against the tensor-by-tensor path: one Triton scatter per load, its plan cached per layout (one plan
    for every slot: the pool's size does not multiply the plans)."""
    import numpy as np

    from multilora_cli.engine.staging import DeviceStager

    adapters = [_adapter(f"a{i}", {m: 8 for m in SHAPES}, seed=10 + i) for i in range(4)]
    packed = [pack_adapter(a, pin=False) for a in adapters]
    cached, plain = _modules(max_loras=3), _modules(max_loras=3)
    w = SlotWriter(cached, torch.device("cpu"))
    monkeypatch.setattr(w, "cuda", True)
    monkeypatch.setattr(w, "_host", lambda arr: torch.from_numpy(np.ascontiguousarray(arr)))
    w.stager = DeviceStager(torch.device("cpu"), numel=packed[0].flat.numel(), dtype=packed[0].flat.dtype, n_buffers=2)
    ref = SlotWriter(plain, torch.device("cpu"))
    # groups of loads; the adapters of a group marked True are staged together first (two buffers in use)
    plan = [
        ([(0, 0)], False),
        ([(1, 1), (2, 2)], True),
        ([(0, 3)], True),
        ([(1, 0)], False),
        ([(2, 1), (0, 2)], True),
        ([(1, 3)], False),
    ]
    for step, (loads, stage) in enumerate(plan):
        if stage:
            assert all(w.stager.stage(packed[i]) for _, i in loads)
        for slot, i in loads:
            w.install(slot, packed[i])
            ref.install(slot, adapters[i])
            assert packed[i].staged is None  # a staged copy is used once
            for (a0, b0, r0, s0), (a1, b1, r1, s1) in zip(_state(plain, slot), _state(cached, slot)):
                assert torch.equal(r0, r1) and torch.equal(s0, s1), step
                assert torch.equal(a0[:, :8], a1[:, :8]) and torch.equal(b0[:, :8], b1[:, :8]), step
    assert len(w._plans) == 1  # one layout: one plan for all 3 slots, whichever buffer the adapter came from
    assert w.stager.stats()["taken"] == 5


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton scatter on CPU tensors: interpreter")
def test_scatter_path_loads_mixed_ranks_and_missing_slices(monkeypatch):
    """Non-uniform modules (per-slice ranks, unadapted slices) below the pool's max rank through the one-launch
    scatter, against the tensor-by-tensor path."""
    import numpy as np

    mixed = _adapter("m", {"q_proj": 4, "v_proj": 8, "o_proj": 2, "gate_proj": 4, "up_proj": 6}, seed=2)
    plain, packed = _modules(max_rank=16), _modules(max_rank=16)
    w = SlotWriter(packed, torch.device("cpu"))
    monkeypatch.setattr(w, "cuda", True)
    monkeypatch.setattr(w, "_host", lambda arr: torch.from_numpy(np.ascontiguousarray(arr)))
    SlotWriter(plain, torch.device("cpu")).install(2, mixed)
    w.install(2, pack_adapter(mixed, pin=False))
    assert len(w._plans) == 1
    for (a0, b0, r0, s0), (a1, b1, r1, s1) in zip(_state(plain, 2), _state(packed, 2)):
        assert torch.equal(r0, r1) and torch.equal(s0, s1)
        for i, r in enumerate(r0.tolist()):
            assert torch.equal(a0[i, :r], a1[i, :r])
        rmax = int(r0.max())
        assert rmax == 0 or torch.equal(b0[:, :rmax], b1[:, :rmax])
