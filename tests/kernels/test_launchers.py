"""Launcher argument checks and the block-size table."""

from __future__ import annotations

import os

import pytest
import torch

from multilora_cli.kernels import build_lora_meta
from multilora_cli.kernels.blocks import ShrinkBlocks, expand_blocks, shrink_blocks
from multilora_cli.kernels.meta import TILE_BLOCKS
from tests.kernels.lora_cases import make_pool, token_slots

interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter tests (CPU only)")


@interp
def test_shrink_rejects_bad_arguments():
    from multilora_cli.kernels.sgmv_shrink import lora_shrink, shrink_out_shape

    w = make_pool(64, [64, 16, 16], torch.float32)
    ts = token_slots("uniform", 5)
    meta = build_lora_meta(ts)
    x = torch.randn(5, 64)
    out = torch.empty(shrink_out_shape(x, w))
    with pytest.raises(ValueError, match=r"x must be \[T, 64\]"):
        lora_shrink(torch.randn(5, 63), w, meta, out)
    with pytest.raises(ValueError, match="dtype"):
        lora_shrink(x.to(torch.int32), w, meta, out)
    with pytest.raises(ValueError, match="column stride"):
        lora_shrink(torch.randn(64, 5).T, w, meta, out)
    with pytest.raises(ValueError, match="out must be fp32"):
        lora_shrink(x, w, meta, out.half())
    with pytest.raises(ValueError, match="for 6 tokens"):
        lora_shrink(torch.randn(5, 64), w, build_lora_meta(ts + [1]), out)


@interp
def test_expand_rejects_bad_arguments():
    from multilora_cli.kernels.sgmv_expand import lora_expand

    w = make_pool(64, [64, 16, 16], torch.float32)
    meta = build_lora_meta(token_slots("uniform", 5))
    s = torch.zeros(1, 5, 3, 64)
    with pytest.raises(ValueError, match=r"y must be \[T, 96\]"):
        lora_expand(s, w, meta, torch.zeros(5, 95))
    with pytest.raises(ValueError, match="s must be fp32"):
        lora_expand(torch.zeros(1, 5, 3, 32), w, meta, torch.zeros(5, 96))
    w.rank = w.rank.long()
    with pytest.raises(ValueError, match="rank must be contiguous int32"):
        lora_expand(s, w, meta, torch.zeros(5, 96))


@pytest.mark.parametrize("t", [1, 7, 16, 64, 133, 256, 1024, 4096, 8192])
@pytest.mark.parametrize("in_f,n_slices,out", [(4096, 3, 6144), (4096, 1, 4096), (4096, 2, 28672), (14336, 1, 4096)])
@pytest.mark.parametrize("max_rank", [8, 16, 64])
def test_block_table_is_valid(t, in_f, n_slices, out, max_rank):
    sb = shrink_blocks(t, in_f, n_slices, max_rank, 132)
    assert sb.bm in TILE_BLOCKS and sb.bk >= 32 and sb.split >= 1
    assert (in_f // sb.bk) % sb.split == 0 and in_f // (sb.bk * sb.split) >= 2, "equal splits of >= 2 K steps"
    eb = expand_blocks(t, out, n_slices, max_rank, 132)
    assert eb.bm in TILE_BLOCKS and eb.bn >= 16 and eb.nb >= 1


def test_block_table_varies_with_shape():
    """Not one size for all: decode and prefill get different tiles, small batches split K."""
    small, big = shrink_blocks(1, 4096, 3, 16, 132), shrink_blocks(4096, 4096, 3, 16, 132)
    assert small.bm < big.bm and small.split > big.split
    assert expand_blocks(1, 6144, 3, 16, 132) != expand_blocks(4096, 6144, 3, 16, 132)
    with pytest.raises(ValueError):
        ShrinkBlocks(bm=24, bk=64, split=1)


def test_block_table_many_small_tiles_rules():
    """16-128 tokens (results/ab-small-blocks-h200-run{2,3}.json): the two-slice shrink splits at most 8 ways,
    other shrinks as before; wide expands take 4 column blocks per CTA at 17-64 tokens, narrow ones one."""
    assert [shrink_blocks(t, 4096, 2, 16, 132).split for t in (1, 15, 16, 64, 65, 128)] == [16, 16, 8, 8, 8, 8]
    assert [shrink_blocks(t, 4096, 3, 16, 132).split for t in (16, 64)] == [16, 16]
    assert shrink_blocks(64, 14336, 1, 16, 132).split == 16
    assert [expand_blocks(t, 28672, 2, 16, 132).nb for t in (16, 17, 64, 65)] == [1, 4, 4, 2]
    assert expand_blocks(64, 6144, 3, 16, 132).nb == 1 and expand_blocks(64, 28672, 2, 16, 132).bn == 128


def test_block_tables_key_on_power_of_two_buckets_above_256():
    """Eager prefill steps come in every size; each distinct block set is one more Triton compile, so sizes
    above 256 share their bucket's blocks (decode sizes, one graph each, keep their own)."""
    from multilora_cli.kernels.blocks import token_bucket

    assert [token_bucket(t) for t in (1, 255, 256, 257, 512, 513, 8192)] == [1, 255, 256, 512, 512, 1024, 8192]
    for in_f, n_slices, out in [(4096, 3, 6144), (14336, 1, 4096), (4096, 2, 28672)]:
        sets = {
            (shrink_blocks(t, in_f, n_slices, 16, 132), expand_blocks(t, out, n_slices, 16, 132))
            for t in range(257, 8193)
        }
        assert len(sets) == 5  # 512, 1024, 2048, 4096, 8192
        assert shrink_blocks(300, in_f, n_slices, 16, 132) == shrink_blocks(512, in_f, n_slices, 16, 132)


def test_silu_larger_buckets_step_through_fewer_columns_at_decode_sizes():
    """The fused SiLU expand's rank-32 / rank-64 buckets hold at most twice the rank-16 bucket's B elements at
    64-256 tokens (occupancy), and take the whole block elsewhere (latency at 1-16 tokens, steps above 256)."""
    from multilora_cli.kernels.blocks import silu_bucket_columns

    assert [silu_bucket_columns(256, rb, 256) for rb in (32, 64)] == [256, 128]
    assert silu_bucket_columns(128, 64, 64) == 64 and silu_bucket_columns(16, 64, 100) == 16
    assert all(silu_bucket_columns(256, 64, t) == 256 for t in (1, 16, 63, 257, 1024, 8192))
