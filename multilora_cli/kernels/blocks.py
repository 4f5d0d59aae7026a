"""Block sizes for the SGMV kernels, chosen per shape from a small table.

Keys are static per (layer, batch size): token count T, hidden sizes, max rank. Nothing here may depend on
the adapter mix of a step, so a CUDA graph captured at batch size T stays valid for every later mix.
Tuned on H100 and H200 (benchmarks/bench_kernels.py --sweep); other GPUs get the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from multilora_cli.kernels.meta import TILE_BLOCKS


@dataclass(frozen=True, slots=True)
class ShrinkBlocks:
    """bm: token rows per tile; bk: in-features per K step for the rank-16 bucket (halved for 32, quartered
    for 64, at least 32, so a stage holds the same bytes); split: K splits, written as partial sums."""

    bm: int
    bk: int
    split: int
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        if self.bm not in TILE_BLOCKS or self.bk < 32 or self.bk & (self.bk - 1) or self.split < 1:
            raise ValueError(f"bad {self}: bm in {TILE_BLOCKS}, bk a power of two >= 32, split >= 1")


@dataclass(frozen=True, slots=True)
class ExpandBlocks:
    """bm: token rows per tile; bn: output columns per step; nb: column steps per CTA (s loaded once)."""

    bm: int
    bn: int
    nb: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        if self.bm not in TILE_BLOCKS or self.bn < 16 or self.bn & (self.bn - 1) or self.nb < 1:
            raise ValueError(f"bad {self}: bm in {TILE_BLOCKS}, bn a power of two >= 16, nb >= 1")


@dataclass(frozen=True, slots=True)
class SiluBlocks:
    """The fused expand + SiLU-and-mul (sgmv_silu.py). bm: token rows per tile; bn: columns of each of the two
    slices per CTA (one block per CTA: straight-line code)."""

    bm: int
    bn: int
    num_warps: int = 4

    def __post_init__(self):
        if self.bm not in TILE_BLOCKS or self.bn < 16 or self.bn & (self.bn - 1):
            raise ValueError(f"bad {self}: bm in {TILE_BLOCKS}, bn a power of two >= 16")


def token_bucket(t: int) -> int:
    """The token count the tables key on: T itself up to 256 (decode graphs are captured per size), the next
    power of two above. Eager prefill steps come in any size up to max_num_batched_tokens, and every distinct
    set of blocks is one more Triton compile (~0.35 s on an H200 host, paid inside the first steps that meet it:
    benchmarks/profile_jit.py); per bucket, the sizes above 256 share 5 sets up to 8192 tokens."""
    return t if t <= 256 else 1 << (t - 1).bit_length()


def _bm_for(t: int) -> int:
    # Segments are usually much shorter than T (many adapters); masked rows cost no bytes, only FLOPs.
    if t <= 256:
        return 16
    if t <= 1024:
        return 32
    return 64


@lru_cache(maxsize=4096)
def shrink_blocks(t: int, in_features: int, n_slices: int, max_rank: int, num_sms: int = 132) -> ShrinkBlocks:
    """Blocks for x[T, in] -> s[T, n_slices, max_rank]. Split-K fills the GPU when there are few tiles.

    H100/H200 sweep (benchmarks/results): at 16 tokens splits of 16-32 win (one tile, K is the only big
    dimension); at 256 tokens 4-8 (enough tiles already); large T needs none.
    """
    t = token_bucket(t)
    bm = _bm_for(t)
    bk = 128 if t <= 1024 else 64
    steps = max(in_features // bk, 1)
    tiles = -(-t // bm)  # lower bound: many adapters make more (partial) tiles
    split = 1
    # about one CTA per SM from the tiles alone; >= 2 K steps per split; splits of equal length (no ragged K)
    while tiles * split * 2 <= num_sms and steps % (split * 2) == 0 and steps // (split * 2) >= 2:
        split *= 2
    del max_rank  # the rank bucket is picked per slot inside the kernel
    warps, stages = (8 if bm >= 64 else 4), (3 if bk >= 128 else 4)
    # H200, 256 tokens x 16 / 64 adapters: one- and two-slice shrinks (o, down, gate_up) are latency-bound;
    # 2 warps with a 5-deep pipeline: down 11.4 -> 9.7 us at 16 adapters, 17.1 -> 16.0 at 64. qkv (4 x 16 rank
    # columns per tile) is slower with 2 warps.
    if 128 < t <= 256 and n_slices <= 2 and bk == 128:
        warps, stages = 2, 5
    # Two slices ([gate | up]) at 16-128 tokens: at most 8 splits. Its expand is the widest (2 x 14,336 columns:
    # 224 CTAs per tile, each summing every partial), so halving the partials pays there for any adapter count
    # (H200, the engine's shrink + fused SiLU expand, us: 16 tokens / 16 adapters 16.7 -> 14.5, 64 / 1 9.1 ->
    # 8.5, 64 / 64 49.8 -> 41.8, 128 / 1 13.3 -> 11.8, 128 / 64 53.0 -> 42.7). One- and three-slice modules lose
    # with it at 1-16 adapters (down 9.3 -> 13.5 at 16 / 16): their expands are 4-6x narrower.
    if 16 <= t <= 128 and n_slices == 2:
        split = min(split, 8)
    return ShrinkBlocks(bm=bm, bk=bk, split=split, num_warps=warps, num_stages=stages)


@lru_cache(maxsize=4096)
def expand_blocks(t: int, out_features: int, n_slices: int, max_rank: int, num_sms: int = 132) -> ExpandBlocks:
    """Blocks for s[T, n_slices, max_rank] -> y[T, out]. Each CTA streams nb column blocks with s loaded once;
    nb grows until there are ~4 CTAs per SM from the tiles T alone would make (more adapters = more tiles)."""
    t = token_bucket(t)
    bm = _bm_for(t)
    bn = 128 if out_features >= 1024 else 64
    tiles = -(-t // bm)
    blocks = -(-out_features // bn) + n_slices
    groups_per_tile = max(1, (4 * num_sms) // tiles)
    nb = max(1, min(32, blocks // groups_per_tile))
    # The kernel sweep's 4096-token winners (nb=1, shrink split 4/16) made prefill steps (8k tokens) slower end to
    # end: not applied.
    # 129-256 tokens (decode at large batch), H200 sweeps at 16 / 64 adapters: narrow outputs take one column
    # block per CTA (the expand stalls on shared-memory barriers as much as on memory); with PDL and tiles-last
    # grids, 4 warps without a cp.async pipeline win: narrow outputs one 256-column block (qkv 6.05 -> 5.47 /
    # 10.34 -> 10.03 us, o and down -0.2 us at 16 adapters, equal at 64), gate_up four 128-column blocks
    # (15.64 -> 14.00 / 32.21 -> 30.14, vs nb=6 with a 3-stage pipeline). Re-timed with the shrink's real 8
    # random partials and the straight-line one-block code, the table stays best or within 0.1 us at 16
    # adapters; qkv with 2 x 256 columns on 2 warps wins at 64 adapters (10.7 vs 12.9 us) but loses at 16
    # (8.0 vs 6.0), and a graph's blocks cannot depend on the adapter mix, so e2e decode's ~16 decides.
    del max_rank  # the rank bucket is picked per slot inside the kernel
    # 17-64 tokens, wide outputs (> 8192: gate_up when its expand is not fused with SiLU): four 128-column
    # blocks per CTA instead of one (H200, gate_up us: 32 tokens / 8 adapters 14.1 -> 10.2, 64 / 1 14.9 -> 10.2,
    # 64 / 64 51.4 -> 41.1; at 16 tokens / 1 adapter it loses, 6.1 -> 8.3, and at 96-128 tokens / 16 adapters
    # the layer by 2.5%, so not there). The formula below plans
    # ~4 CTAs per SM from T / 16 tiles; a 28,672-column expand with one block per CTA is 224 short CTAs per
    # tile, each paying the tile lookups and the partial sums.
    if 16 < t <= 64 and out_features > 8192:
        return ExpandBlocks(bm=bm, bn=128, nb=4, num_warps=4, num_stages=3)
    if 128 < t <= 256:
        if out_features <= 8192:
            return ExpandBlocks(bm=bm, bn=256, nb=1, num_warps=4, num_stages=1)
        return ExpandBlocks(bm=bm, bn=128, nb=4, num_warps=4, num_stages=1)
    return ExpandBlocks(bm=bm, bn=bn, nb=nb, num_warps=8 if bm * bn >= 64 * 128 else 4, num_stages=3 if nb >= 3 else 2)


@lru_cache(maxsize=256)
def silu_blocks(t: int) -> SiluBlocks:
    """Blocks for the fused expand + SiLU-and-mul over T tokens (two [BM, BN] y tiles and B blocks per CTA).

    H200, Llama-3-8B gate_up, rank 16 (us): 1 token 64 columns
    (5.7 vs 6.6 for 128); 16 tokens 128 (10.3 vs 10.8 for 256); 64-256 tokens 256 (256/16: 23.0 vs 25.5 for
    128); above, 32-row tiles of 128 columns beat 64-row ones (4096 tokens 164 vs 180-203, 8192: 283 vs 291+).
    """
    if t <= 256:
        return SiluBlocks(bm=16, bn=64 if t < 16 else 128 if t < 64 else 256)
    return SiluBlocks(bm=32, bn=128)


def silu_bucket_columns(bn: int, rb: int, t: int) -> int:
    """Columns per step of the fused SiLU expand's rank-rb bucket (rb 32 or 64) in a CTA of bn columns: bn, or at
    64-256 tokens fewer, so that the bucket's two B tiles (gate and up, [rb, columns] each) hold at most twice the
    rank-16 bucket's elements. Registers and shared memory are allocated for a kernel's largest branch: in a
    rank-64 slot pool the rank-64 branch's 2 x [64, 256] tiles (116 registers, 72 KiB shared) set every CTA's
    occupancy, rank-16 ones included (rank-16 bucket alone: 80, 21 KiB). H200, 256 tokens / 64 adapters, pool
    max_rank 64 (us): rank-16 adapters 61.3 -> 53.7, rank-64 136.2 -> 114.2, ranks 16 / 64 alternating 95.3 ->
    82.5; 64 tokens -15 to -16%. Outside 64-256 tokens it lost where it mattered (1 token, rank 64: 10.0 -> 11.0;
    16 tokens, mixed: 21.6 -> 23.7; 1,024 tokens, rank 64: 186 -> 200). The plain expand keeps bn: its
    sub-stepped arms were slower with rank-64 and mixed adapters (same measurements)."""
    if 64 <= t <= 256:
        return max(16, min(bn, bn * 32 // rb))
    return bn


def tile_index(bm: int) -> int:
    """Row of LoraMeta.tiles holding the tile map for row-block size bm."""
    return TILE_BLOCKS.index(bm)
