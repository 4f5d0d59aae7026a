"""The one-launch SGMV kernel (sgmv_fused.py, interpreter on CPU) against the float64 reference."""

from __future__ import annotations

import os

import pytest
import torch
from lora_cases import POPULARITY, assert_matches, make_pool, token_slots

from multilora_cli.kernels import LoraMetaBuffers, build_lora_meta
from multilora_cli.kernels.blocks import FusedBlocks
from multilora_cli.kernels.reference import add_lora_reference
from multilora_cli.kernels.sgmv_fused import add_lora_fused, fusable

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter tests (CPU only)")

QKV = (128, [256, 64, 64])  # GQA q/k/v widths scaled down for the interpreter
TOL = {torch.float32: 1e-4, torch.float16: 1e-2}
ONE_BLOCK = FusedBlocks(bm=16, bk=64, bn=64, nb=1)  # straight-line column code
LOOPED = FusedBlocks(bm=32, bk=32, bn=32, nb=3)  # several column steps per CTA, groups straddling slice ends


def _run(in_f, slices, dtype, ts, blocks, seed=0, meta=None, **pool):
    w = make_pool(in_f, slices, dtype, seed=seed, **pool)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(len(ts), in_f, generator=g).to(dtype)
    y = torch.randn(len(ts), sum(slices), generator=g).to(dtype)
    y0 = y.clone()
    add_lora_fused(y, x, w, meta or build_lora_meta(ts), blocks)
    assert_matches(y, y0, add_lora_reference(y0, x, w, torch.tensor(ts)), ts, w, TOL[dtype])


@pytest.mark.parametrize("t", [1, 7, 133])
@pytest.mark.parametrize("pattern", POPULARITY)
def test_fused_fp32(pattern, t):
    _run(*QKV, torch.float32, token_slots(pattern, t, seed=t), ONE_BLOCK if t % 2 else LOOPED)


@pytest.mark.parametrize("pattern", ["distinct", "zipf", "skewed", "identical"])
def test_fused_fp16(pattern):
    _run(*QKV, torch.float16, token_slots(pattern, 133, seed=3), LOOPED)


@pytest.mark.parametrize("in_f,slices", [(160, [96]), (96, [200, 200]), (200, [40, 24, 24])])
@pytest.mark.parametrize("blocks", [ONE_BLOCK, LOOPED], ids=["one-block", "looped"])
def test_fused_other_projections(in_f, slices, blocks):
    """o/down (one slice), gate_up (two), K and widths that are not multiples of the blocks."""
    _run(in_f, slices, torch.float32, token_slots("uniform", 29, seed=7), blocks)


@pytest.mark.parametrize("max_rank,slot_ranks", [(16, {0: 16, 2: 3, 5: 9}), (32, {1: 32, 2: 17, 4: 5})])
def test_fused_small_pools(max_rank, slot_ranks):
    """Pools whose max rank compiles only the 16 (or 16 and 32) buckets."""
    ts = token_slots("uniform", 37, seed=max_rank, slots=list(slot_ranks))
    _run(64, [96, 32, 32], torch.float32, ts, ONE_BLOCK, seed=max_rank, slot_ranks=slot_ranks, max_loras=8,
         max_rank=max_rank)


def test_fused_static_meta_buffers():
    bufs = LoraMetaBuffers(max_tokens=40, max_loras=12, device="cpu")
    for seed, (pattern, t) in enumerate([("zipf", 24), ("all-base", 40), ("distinct", 17)]):
        ts = token_slots(pattern, t, seed=seed)
        _run(*QKV, torch.float32, ts, LOOPED, seed=seed, meta=bufs.build(ts))


def test_fused_refuses_ranks_above_64():
    w = make_pool(64, [32], torch.float32, slot_ranks={1: 100}, max_loras=4, max_rank=128)
    assert not fusable(w)
    with pytest.raises(ValueError, match="not fusable"):
        add_lora_fused(torch.zeros(3, 32), torch.zeros(3, 64), w, build_lora_meta([1, 1, 1]), ONE_BLOCK)
