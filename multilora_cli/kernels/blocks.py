"""Block sizes for the SGMV kernels, chosen per shape from a small table.

Keys are static per (layer, batch size): token count T, hidden sizes, max rank. Nothing here may depend on
the adapter mix of a step, so a CUDA graph captured at batch size T stays valid for every later mix.
Tuned on H100 (benchmarks/bench_kernels.py --sweep); other GPUs get the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from multilora_cli.kernels.meta import TILE_BLOCKS


@dataclass(frozen=True, slots=True)
class ShrinkBlocks:
    """bm: token rows per tile; bk: in-features per step; rb: rank rows per CTA (>= 16, the tensor-core
    minimum; a rank-8 adapter costs rb=16 of FLOPs but only 8 rows of bytes); split: K splits (partial sums)."""

    bm: int
    bk: int
    rb: int
    split: int
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True, slots=True)
class ExpandBlocks:
    """bm: token rows per tile; bn: output columns per step; nb: column steps per CTA; rb: rank chunk."""

    bm: int
    bn: int
    nb: int
    rb: int
    num_warps: int = 4
    num_stages: int = 2


def _pow2_at_least(n: int, lo: int = 16) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


def _bm_for(t: int) -> int:
    # Segments are usually much shorter than T (many adapters); masked rows cost no bytes, only FLOPs.
    if t <= 256:
        return 16
    if t <= 1024:
        return 32
    return 64


@lru_cache(maxsize=4096)
def shrink_blocks(t: int, in_features: int, n_slices: int, max_rank: int, num_sms: int = 132) -> ShrinkBlocks:
    """Blocks for x[T, in] -> s[T, n_slices, max_rank]. Split-K fills the GPU when there are few tiles."""
    bm = _bm_for(t)
    rb = 16 if t <= 1024 else min(_pow2_at_least(max_rank), 64)
    bk = 128 if t <= 1024 else 64
    tiles = -(-t // bm)  # lower bound: many adapters make more (partial) tiles
    split = 1
    # aim for ~2 CTAs per SM (one rank chunk active per tile in the common case), >= 2 K-steps per split
    while tiles * split * 2 <= 2 * num_sms and in_features // (bk * split * 2) >= 2:
        split *= 2
    nsp = _pow2_at_least(n_slices, 1)
    warps = 8 if bm * nsp * rb >= 64 * 128 else 4
    return ShrinkBlocks(bm=bm, bk=bk, rb=rb, split=split, num_warps=warps, num_stages=3 if bk >= 128 else 4)


@lru_cache(maxsize=4096)
def expand_blocks(t: int, out_features: int, max_rank: int, num_sms: int = 132) -> ExpandBlocks:
    """Blocks for s[T, n_slices, max_rank] -> y[T, out]."""
    bm = _bm_for(t)
    rb = 16 if t <= 256 else min(_pow2_at_least(max_rank), 64)
    bn = 128 if out_features >= 1024 else 64
    tiles = -(-t // bm)
    nb = 1
    # several column steps per CTA amortise the tile set-up; keep >= ~4 CTAs per SM
    while tiles * (out_features // (bn * nb * 2)) >= 4 * num_sms and nb < 8:
        nb *= 2
    warps = 8 if bm * bn >= 64 * 128 else 4
    return ExpandBlocks(bm=bm, bn=bn, nb=nb, rb=rb, num_warps=warps, num_stages=2)


def tile_index(bm: int) -> int:
    """Row of LoraMeta.tiles holding the tile map for row-block size bm."""
    return TILE_BLOCKS.index(bm)
