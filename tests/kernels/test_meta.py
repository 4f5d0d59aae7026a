"""Per-step metadata: grouping, tile maps, and the fixed-capacity buffers used under CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels import LoraMetaBuffers, build_lora_meta
from multilora_cli.kernels.meta import TILE_BLOCKS, tile_capacity
from tests.kernels.lora_cases import POPULARITY, token_slots


def _check(meta, ts):
    t = len(ts)
    order = meta.sorted_idx.tolist()
    assert sorted(order) == list(range(t))
    adapted = [i for i in range(t) if ts[i] >= 0]
    # stable sort by slot, base tokens last
    assert order[: len(adapted)] == sorted(adapted, key=lambda i: (ts[i], i))
    assert [s for s, _, _ in meta.segments] == sorted({ts[i] for i in adapted})
    assert meta.seg_slot.tolist() == [s for s, _, _ in meta.segments]
    assert meta.num_adapted.tolist() == [len(adapted)], "num_adapted: where the base tokens start in sorted_idx"
    for k, bm in enumerate(TILE_BLOCKS):
        slot, lo, hi = meta.tiles[k].tolist()
        n = meta.tile_counts[k]
        assert all(s == -1 for s in slot[n:]), "padding tiles must say 'no work'"
        covered = []
        for s, a, b in zip(slot[:n], lo[:n], hi[:n]):
            assert 0 < b - a <= bm
            rows = order[a:b]
            assert all(ts[i] == s for i in rows), "a tile must hold one slot's tokens only"
            covered += rows
        assert sorted(covered) == sorted(adapted), "every adapted token in exactly one tile"
        assert n <= -(-t // bm) + min(len(meta.segments), t)


@pytest.mark.parametrize("pattern", POPULARITY)
@pytest.mark.parametrize("t", [1, 7, 133])
def test_build_lora_meta(pattern, t):
    ts = token_slots(pattern, t, seed=t)
    _check(build_lora_meta(ts), ts)


def test_buffers_reuse_fixed_addresses_and_match():
    bufs = LoraMetaBuffers(max_tokens=150, max_loras=12, device="cpu")
    ptrs = None
    for seed, pattern in enumerate(POPULARITY):
        ts = token_slots(pattern, 133 if pattern != "one-token" else 1, seed=seed)
        meta = bufs.build(ts)
        assert meta.static
        _check(meta, ts)
        fresh = build_lora_meta(ts)
        assert meta.segments == fresh.segments and meta.tile_counts == fresh.tile_counts
        p = (meta.token_slot.data_ptr(), meta.sorted_idx.data_ptr(), meta.tiles.data_ptr(), meta.num_adapted.data_ptr())
        assert ptrs in (None, p), "buffers must keep their addresses (CUDA graphs replay them)"
        ptrs = p
        assert meta.tiles.shape[2] == tile_capacity(150, 12)


def test_buffers_reject_overflow():
    bufs = LoraMetaBuffers(max_tokens=8, max_loras=2, device="cpu")
    with pytest.raises(ValueError, match="capacity"):
        bufs.build([0] * 9)
    with pytest.raises(ValueError, match="max_loras"):
        bufs.build([0, 1, 2])
    assert bufs.build([]).tile_counts == (0,) * len(TILE_BLOCKS)


def test_empty_and_base_only():
    meta = build_lora_meta([-1, -1, -1])
    assert not meta.any_lora and meta.tile_counts == (0,) * len(TILE_BLOCKS)
    assert (meta.tiles[:, 0] == -1).all()
    assert build_lora_meta(torch.tensor([], dtype=torch.int32)).num_tokens == 0
