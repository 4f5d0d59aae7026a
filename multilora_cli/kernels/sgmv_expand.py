"""SGMV expand: y[:, slice] += s @ B^T for every token's adapter, all packed slices in one launch, in place.

Grid: (column groups, tiles). Column groups are numbered slice after slice (each slice's width rounded up
to BN * nb), so a CTA never straddles two slices. A CTA loads its rows' s once (the sum of the shrink's
K-split partials), then streams nb column blocks of B (rank-major: each rank row is contiguous over out) and
y; a single block (every decode size) is straight-line code whose B and y loads may precede the PDL wait.
Rank-aware: the CTA picks the smallest rank bucket RB in {16, 32, 64} >= the slot's rank (FLOPs padded to
that bucket only), masks B rows past the rank (no bytes), and walks chunks of 64 for ranks above 64. Base
rows are never touched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.blocks import ExpandBlocks, expand_blocks, tile_index
from multilora_cli.kernels.checks import check_meta, check_weights, check_x, num_sms, rank_bucket, tile_grid
from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.meta import LoraMeta
from multilora_cli.kernels.pdl import (
    LINE_BYTES,
    PREFETCH_LINES,
    PdlMode,
    launch_dependents,
    pdl_mode,
    prefetch_l2,
    wait_predecessor,
)
from multilora_cli.kernels.weights import LoraWeights

MAX_SLICES = 4


# Most fp32 elements of s one CTA loads at once ([SPLIT, BM, RB], all K-split partials in flight together);
# larger products (rank 64 at big splits) sum the partials one at a time to bound registers.
S_VECTOR_MAX = tl.constexpr(4096)
# From this many tokens on, K-split partials are loaded at once (split 1 always is: a plain load). Below, the
# partials are summed one at a time: with many CTAs resident the one-shot load's registers and reduction cost
# more than the L2 round trips it saves (H200, a Llama-3-8B layer, rank 16: 256 tokens / 64 adapters 89.7 us
# looped vs 95.4 at once, 64 / 64 110.4 vs 171.9; 4096 tokens 380.4 vs 368.7).
S_VECTOR_MIN_TOKENS = 1025


@triton.jit
def _load_s(
    s_rows,
    stride_s_split,
    n_split,
    jj,
    row_ok,
    j_ok,
    BM: tl.constexpr,
    RB: tl.constexpr,
    SPLIT: tl.constexpr,
    VEC: tl.constexpr,
):
    """Sum of the shrink's K-split partials for rank columns jj: [BM, RB] fp32 (SPLIT = n_split rounded up to a
    power of two). Loaded as one [SPLIT, BM, RB] tensor: one L2 round trip instead of n_split dependent ones."""
    if VEC and SPLIT * BM * RB <= S_VECTOR_MAX:
        p = tl.arange(0, SPLIT)
        ptrs = s_rows[None, :, :] + p[:, None, None] * stride_s_split + jj[None, None, :]
        ok = (p < n_split)[:, None, None] & row_ok[None, :, None] & j_ok[None, None, :]
        sv = tl.sum(tl.load(ptrs, mask=ok, other=0.0), axis=0)
    else:
        sv = tl.zeros((BM, RB), dtype=tl.float32)
        for p in range(n_split):
            sv += tl.load(s_rows + p * stride_s_split + jj[None, :], mask=row_ok[:, None] & j_ok[None, :], other=0.0)
    return sv


def partial_sum_args(s: torch.Tensor, t: int, vector_min_tokens: int = S_VECTOR_MIN_TOKENS) -> dict:
    """Launch constants for `_load_s` from s [split, T, ...]: SPLIT (power of two) and the vector-load choice
    (all partials at once from `vector_min_tokens` tokens on)."""
    return dict(SPLIT=triton.next_power_of_2(s.shape[0]), VEC=s.shape[0] == 1 or t >= vector_min_tokens)


@triton.jit
def load_block(b_ptrs, y_ptrs, j_ok, col_ok, ok):
    """A column block's B [RB, BN] (rank rows past j_ok masked: no bytes) and y [BM, BN], both issued at once."""
    bt = tl.load(b_ptrs, mask=j_ok[:, None] & col_ok[None, :], other=0.0)
    yv = tl.load(y_ptrs, mask=ok, other=0.0)
    return bt, yv


@triton.jit
def _add_block(y_ptrs, yv, sv, bt, ok, DOT_PREC: tl.constexpr):
    """y[rows, cols] = yv + sv @ bt, added in fp32 and rounded once."""
    acc = tl.dot(sv, bt.to(sv.dtype), input_precision=DOT_PREC)  # [BM, BN] fp32
    tl.store(y_ptrs, (yv.to(tl.float32) + acc).to(y_ptrs.dtype.element_ty), mask=ok)


@triton.jit
def _stream_columns(
    s_rows,
    stride_s_split,
    n_split,
    b_slot,
    stride_b_out,
    stride_b_rank,
    y_rows,
    row_ok,
    r,
    n0,
    col_hi,
    nb,
    PDL: tl.constexpr,
    DOT_PREC: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    RB: tl.constexpr,
    SPLIT: tl.constexpr,
    VEC: tl.constexpr,
    NB1: tl.constexpr,
    EARLY: tl.constexpr,
):
    """r <= RB: y[rows, cols] += s @ B[cols, :r]^T over nb column blocks, s loaded once; waits on the predecessor.

    One block (NB1: every decode size in the table) is straight-line code: no loop for the software pipeliner to
    wrap (1-16 tokens: -17..-25% per layer). With EARLY (the launch right after its shrink: `add_lora_triton`)
    the CTA loads its B and y before gdc_wait and only s after it. That is safe: the shrink's first CTA passes
    its own gdc_wait before this grid may start (pdl.py), so every launch before the shrink, i.e. the slot loads
    that wrote B and the matmul that wrote y, has completed."""
    CD = y_rows.dtype.element_ty
    offs_r = tl.arange(0, RB)
    j_ok = offs_r < r
    b_base = b_slot + offs_r[:, None] * stride_b_rank  # [RB, 1]
    if NB1:
        cols = n0 + tl.arange(0, BN)
        col_ok = cols < col_hi
        ok = row_ok[:, None] & col_ok[None, :]
        y_ptrs = y_rows + cols[None, :]
        b_ptrs = b_base + cols[None, :] * stride_b_out
        if EARLY:
            bt, yv = load_block(b_ptrs, y_ptrs, j_ok, col_ok, ok)
        wait_predecessor(PDL)  # s comes from the shrink
        launch_dependents(PDL)
        if not EARLY:
            bt, yv = load_block(b_ptrs, y_ptrs, j_ok, col_ok, ok)
        sv = _load_s(s_rows, stride_s_split, n_split, offs_r, row_ok, j_ok, BM, RB, SPLIT, VEC).to(CD)
        _add_block(y_ptrs, yv, sv, bt, ok, DOT_PREC)
    else:
        wait_predecessor(PDL)
        launch_dependents(PDL)
        sv = _load_s(s_rows, stride_s_split, n_split, offs_r, row_ok, j_ok, BM, RB, SPLIT, VEC).to(CD)
        for it in range(nb):
            cols = n0 + it * BN + tl.arange(0, BN)
            col_ok = cols < col_hi
            ok = row_ok[:, None] & col_ok[None, :]
            bt, yv = load_block(b_base + cols[None, :] * stride_b_out, y_rows + cols[None, :], j_ok, col_ok, ok)
            _add_block(y_rows + cols[None, :], yv, sv, bt, ok, DOT_PREC)


@triton.jit
def _stream_columns_chunked(
    s_rows,
    stride_s_split,
    n_split,
    b_slot,
    stride_b_out,
    stride_b_rank,
    y_rows,
    row_ok,
    r,
    n0,
    col_hi,
    nb,
    DOT_PREC: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    RB: tl.constexpr,
    SPLIT: tl.constexpr,
    VEC: tl.constexpr,
):
    """r > RB: as `_stream_columns` after the wait, walking the rank in chunks of RB for every column block."""
    CD = y_rows.dtype.element_ty
    offs_r = tl.arange(0, RB)
    for it in range(nb):
        cols = n0 + it * BN + tl.arange(0, BN)
        col_ok = cols < col_hi
        ok = row_ok[:, None] & col_ok[None, :]
        y_ptrs = y_rows + cols[None, :]
        yv = tl.load(y_ptrs, mask=ok, other=0.0)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for c in range(0, r, RB):
            jj = c + offs_r
            j_ok = jj < r
            sv = _load_s(s_rows, stride_s_split, n_split, jj, row_ok, j_ok, BM, RB, SPLIT, VEC).to(CD)
            bt = tl.load(
                b_slot + jj[:, None] * stride_b_rank + cols[None, :] * stride_b_out,
                mask=j_ok[:, None] & col_ok[None, :],
                other=0.0,
            )
            acc = tl.dot(sv, bt.to(CD), acc, input_precision=DOT_PREC)
        tl.store(y_ptrs, (yv.to(tl.float32) + acc).to(CD), mask=ok)


# scalars that vary with the step (offsets, loop bounds): value-specialising them (== 1, % 16) would compile a
# variant per metadata size / token bucket mid-run (benchmarks/profile_jit.py)
@triton.jit(do_not_specialize=["n_split", "tile_cap", "nb"])
def _expand_kernel(
    s_ptr,
    b_ptr,
    rank_ptr,
    idx_ptr,
    tiles_ptr,
    y_ptr,
    n_split,
    tile_cap,
    n_slices,
    nb,
    O1,
    O2,
    O3,
    O4,
    stride_s_split,
    stride_s_t,
    stride_s_slice,
    stride_b_slot,
    stride_b_out,
    stride_b_rank,
    stride_yt,
    BM: tl.constexpr,
    BN: tl.constexpr,
    MAX_RB: tl.constexpr,
    DOT_PREC: tl.constexpr,
    SPLIT: tl.constexpr,
    VEC: tl.constexpr,
    NB1: tl.constexpr,
    EARLY: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    PF_R: tl.constexpr,
    PF_LINES: tl.constexpr,
    LINE: tl.constexpr,
):
    pid_g = tl.program_id(0)  # tiles on the slow axis: padding tiles are dispatched last (as in the shrink)
    pid_tile = tl.program_id(1)
    first = (pid_tile == 0) & (pid_g == 0)
    # tile and token ids before any branch (as in the shrink): two round trips to the rows, not three
    slot = tl.load(tiles_ptr + pid_tile)
    lo = tl.load(tiles_ptr + tile_cap + pid_tile)
    hi = tl.load(tiles_ptr + 2 * tile_cap + pid_tile)
    m = tl.arange(0, BM)
    row_ok = lo + m < hi
    rows = tl.load(idx_ptr + lo + m, mask=row_ok, other=0).to(tl.int64)  # [BM] token ids
    if slot < 0:  # padding tile
        if first:
            wait_predecessor(PDL)  # the grid's first CTA always waits (see pdl.py)
        return
    slot64 = slot.to(tl.int64)

    # which slice owns column group pid_g: groups are counted slice by slice (O_i = start column of slice i,
    # O_i = out_features for i >= n_slices, so absent slices own no groups)
    gw = BN * nb
    g1 = tl.cdiv(O1, gw)
    g2 = g1 + tl.cdiv(O2 - O1, gw)
    g3 = g2 + tl.cdiv(O3 - O2, gw)
    sl = (pid_g >= g1).to(tl.int32) + (pid_g >= g2).to(tl.int32) + (pid_g >= g3).to(tl.int32)
    col_lo = tl.where(sl == 0, 0, tl.where(sl == 1, O1, tl.where(sl == 2, O2, O3)))
    col_hi = tl.where(sl == 0, O1, tl.where(sl == 1, O2, tl.where(sl == 2, O3, O4)))
    g_lo = tl.where(sl == 0, 0, tl.where(sl == 1, g1, tl.where(sl == 2, g2, g3)))
    r = tl.load(rank_ptr + slot64 * n_slices + sl)
    if r == 0:  # slice not adapted by this slot
        if first:
            wait_predecessor(PDL)
        return
    s_rows = s_ptr + rows[:, None] * stride_s_t + sl * stride_s_slice  # [BM, 1]
    b_slot = b_ptr + slot64 * stride_b_slot
    y_rows = y_ptr + rows[:, None] * stride_yt  # [BM, 1]
    n0 = col_lo + (pid_g - g_lo) * gw
    if PREFETCH:  # B is static during the step: fetch this CTA's lines while the shrink finishes
        pj = tl.arange(0, PF_R)
        pc = n0 + tl.arange(0, PF_LINES) * LINE  # [PF_LINES] first column of each line
        prefetch_l2(
            b_slot,
            pj[:, None] * stride_b_rank + pc[None, :] * stride_b_out,
            (pj < r)[:, None] & ((pc < col_hi) & (pc < n0 + gw))[None, :],
        )
    # smallest rank bucket that holds r; _stream_columns waits on the predecessor itself (after its B load)
    if r <= 16:
        _stream_columns(
            s_rows,
            stride_s_split,
            n_split,
            b_slot,
            stride_b_out,
            stride_b_rank,
            y_rows,
            row_ok,
            r,
            n0,
            col_hi,
            nb,
            PDL,
            DOT_PREC,
            BM,
            BN,
            16,
            SPLIT,
            VEC,
            NB1,
            EARLY,
        )
    else:
        if MAX_RB >= 32:  # compile-time: buckets above the pool's max rank are not compiled
            if r <= 32:
                _stream_columns(
                    s_rows,
                    stride_s_split,
                    n_split,
                    b_slot,
                    stride_b_out,
                    stride_b_rank,
                    y_rows,
                    row_ok,
                    r,
                    n0,
                    col_hi,
                    nb,
                    PDL,
                    DOT_PREC,
                    BM,
                    BN,
                    32,
                    SPLIT,
                    VEC,
                    NB1,
                    EARLY,
                )
            else:
                if MAX_RB >= 64:
                    if r <= 64:
                        _stream_columns(
                            s_rows,
                            stride_s_split,
                            n_split,
                            b_slot,
                            stride_b_out,
                            stride_b_rank,
                            y_rows,
                            row_ok,
                            r,
                            n0,
                            col_hi,
                            nb,
                            PDL,
                            DOT_PREC,
                            BM,
                            BN,
                            64,
                            SPLIT,
                            VEC,
                            NB1,
                            EARLY,
                        )
                    else:
                        if MAX_RB > 64:
                            wait_predecessor(PDL)
                            launch_dependents(PDL)
                            _stream_columns_chunked(
                                s_rows,
                                stride_s_split,
                                n_split,
                                b_slot,
                                stride_b_out,
                                stride_b_rank,
                                y_rows,
                                row_ok,
                                r,
                                n0,
                                col_hi,
                                nb,
                                DOT_PREC,
                                BM,
                                BN,
                                64,
                                SPLIT,
                                VEC,
                            )


def default_expand_blocks(y: torch.Tensor, w: LoraWeights) -> ExpandBlocks:
    return expand_blocks(y.shape[0], w.out_features, w.n_slices, w.max_rank, num_sms(y.device))


def lora_expand(
    s: torch.Tensor,
    w: LoraWeights,
    meta: LoraMeta,
    y: torch.Tensor,
    blocks: ExpandBlocks | None = None,
    after_shrink: bool = False,
    vector_min_tokens: int = S_VECTOR_MIN_TOKENS,
) -> None:
    """Add every adapted token's expanded delta into y, all slices in one launch, in place.

    s:    [split, T, n_slices, R] (or [T, n_slices, R])  fp32, partial sums from `lora_shrink`
    w:    LoraWeights (b [L, out, R] with slices concatenated along out, rank [L, n_slices]); any float dtype
    meta: LoraMeta of the step (tiles on y's device)
    y:    [T, out]                        fp16 | bf16 | fp32, row stride free, unit column stride; updated

        for tile (slot, rows) in meta, for slice i with r = rank[slot, i] > 0:
            y[rows, off_i:off_i+n_i] += (s[:, rows, i, :r].sum(0) @ b[slot, off_i:off_i+n_i, :r].T)
        computed as one dot in y's dtype with fp32 accumulation, added to y in fp32, rounded once.
    Rows of base tokens and columns of rank-0 slices are not written.
    after_shrink: this launch directly follows the `lora_shrink` that wrote s (as in `add_lora_triton`), so with
    PDL the CTAs may load B and y before waiting on it (see `_stream_columns`). Leave False otherwise.
    vector_min_tokens: from this many tokens on, a CTA loads all K-split partials of s at once; below, it sums
    them one at a time (same result; see S_VECTOR_MIN_TOKENS).
    """
    b = blocks or default_expand_blocks(y, w)
    t = check_x(y, w.out_features, "y")
    check_weights(w, y.device)
    check_meta(meta, t, y.device)
    if s.dim() == 3:
        s = s.unsqueeze(0)
    if (
        s.dtype != torch.float32
        or s.dim() != 4
        or tuple(s.shape[1:]) != (t, w.n_slices, w.max_rank)
        or s.stride(3) != 1
        or s.device != y.device
    ):
        raise ValueError(
            f"lora_expand: s must be fp32 [split, {t}, {w.n_slices}, {w.max_rank}] on {y.device} "
            f"with unit last stride, got {s.dtype} {tuple(s.shape)} on {s.device}"
        )
    if w.n_slices > MAX_SLICES:
        raise ValueError(f"lora_expand supports up to {MAX_SLICES} packed slices, got {w.n_slices}")
    n_tiles = tile_grid(meta, b.bm, t, w.max_loras)
    if n_tiles == 0:
        return
    offs = list(w.slice_offsets[1:-1]) + [w.out_features] * (MAX_SLICES - w.n_slices + 1)  # O1..O4
    gw = b.bn * b.nb
    groups = sum(triton.cdiv(w.slice_offsets[i + 1] - w.slice_offsets[i], gw) for i in range(w.n_slices))
    tiles = meta.tiles[tile_index(b.bm)]
    pdl = pdl_mode(y.device, t)
    if pdl.prefetch and w.b.stride(1) != 1:  # the prefetch walks lines along out: rank-major B only
        pdl = PdlMode(launch=True)
    line = LINE_BYTES // w.b.element_size()
    pf_r = min(rank_bucket(w.max_rank), 64)
    pf_lines = triton.next_power_of_2(max(1, min(triton.cdiv(gw, line), PREFETCH_LINES // pf_r)))
    launch(
        _expand_kernel,
        (groups, n_tiles),
        s,
        w.b,
        w.rank,
        meta.sorted_idx,
        tiles,
        y,
        s.shape[0],
        tiles.stride(0),
        w.n_slices,
        b.nb,
        *offs,
        s.stride(0),
        s.stride(1),
        s.stride(2),
        w.b.stride(0),
        w.b.stride(1),
        w.b.stride(2),
        y.stride(0),
        BM=b.bm,
        BN=b.bn,
        MAX_RB=rank_bucket(w.max_rank),
        DOT_PREC="ieee" if y.dtype == torch.float32 else "tf32",
        **partial_sum_args(s, t, vector_min_tokens),
        NB1=b.nb == 1,
        EARLY=after_shrink,
        PDL=pdl.launch,
        PREFETCH=pdl.prefetch,
        PF_R=pf_r,
        PF_LINES=pf_lines if pdl.prefetch else 1,
        LINE=line,
        num_warps=b.num_warps,
        num_stages=b.num_stages,
        **pdl.kwargs(),
    )
