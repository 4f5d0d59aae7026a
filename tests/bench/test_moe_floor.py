"""benchmarks/moe_floor.py: the layer's floor counts what a brute-force count of the routing gives, and its block
counts are the blocks the real alignment kernels (kernels/moe_align.py, interpreter) hand the LoRA launches."""

from __future__ import annotations

import pytest
import torch

from benchmarks.moe_floor import expected_touched, layer_account, lora_bytes
from tests.devices import needs_interpreter

E, K, H, INTER, R = 6, 2, 32, 48, 8


def _routing(T, S, seed):
    g = torch.Generator().manual_seed(seed)
    experts = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    slot = torch.arange(T) % (S + 1) - 1  # every S+1-th token a base row
    return experts, slot


@pytest.mark.parametrize("T, S", [(1, 1), (9, 3), (40, 2)])
def test_floor_counts_the_touched_pairs(T, S):
    experts, slot = _routing(T, S, T)
    acc = layer_account(experts, slot, E, H, INTER, R, 4)
    pairs = {(int(e), int(slot[t])) for t in range(T) for e in experts[t] if slot[t] >= 0}
    assert acc["expert_adapter_pairs"] == len(pairs)
    assert acc["distinct_experts"] == len({int(e) for e in experts.reshape(-1)})
    assert acc["floor_lora_bytes"] == len(pairs) * R * (3 * H + 3 * INTER) * 2 == len(pairs) * lora_bytes(H, INTER, R)
    # the kernels read at least the floor; the row path's DRAM estimate never exceeds its no-reuse bound
    assert acc["floor_lora_bytes"] <= acc["row_lora_dram_bytes"] <= acc["row_lora_bytes"]
    assert acc["floor_lora_bytes"] <= acc["grouped_lora_bytes"]


def test_expected_touched_is_the_uniform_expectation():
    assert expected_touched(128, 8, 1) == pytest.approx(8)
    assert expected_touched(128, 8, 256) == pytest.approx(128, rel=1e-6)
    assert expected_touched(128, 8, 0) == 0.0


@needs_interpreter
def test_blocks_are_the_alignment_kernels_blocks():
    from multilora_cli.kernels.moe_align import align_pairs

    experts, slot = _routing(37, 3, 5)
    for bm in (4, 16):
        acc = layer_account(experts, slot, E, H, INTER, R, bm)
        by_es = align_pairs(experts, slot, E, 3, bm)
        busy = (by_es.block_expert >= 0) & (by_es.block_slot >= 0)
        assert acc["expert_adapter_blocks"] == int(busy.sum())
        by_e = align_pairs(experts, None, E, 0, bm)
        assert acc["expert_blocks"] == int((by_e.block_expert >= 0).sum())


def test_shared_a_is_read_once():
    """PEFT target_parameters: gate and up share one A, so the floor and the shrink count r x H once."""
    experts, slot = _routing(9, 3, 9)
    own, shared = (layer_account(experts, slot, E, H, INTER, R, 4, shared_a=s) for s in (False, True))
    G = own["expert_adapter_pairs"]
    assert own["floor_lora_bytes"] - shared["floor_lora_bytes"] == G * R * H * 2
    assert own["row_lora_bytes"] - shared["row_lora_bytes"] == G * R * H * 2
