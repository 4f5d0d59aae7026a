"""Fused SGMV: shrink and expand in ONE launch, each CTA recomputing its tile's shrink for its own columns.

Grid: (column groups, tiles), as the expand's. A CTA owns one tile (up to BM rows of one slot) and one column
group of one slice. It first computes s = scale * x[rows] @ A[slot, slice, :r]^T over the whole K in registers
(fp32), then streams its nb column blocks: y[rows, cols] += s @ B[slot, cols, :r]^T. No fp32 intermediate in
memory and no kernel boundary between the two halves; the price is that every column group of a (tile, slice)
reads the same A rows again, from L2 after the first (the wider the groups, the fewer re-reads).

(Not session 2's one-launch kernel of the same name, which split shrink CTAs from expand CTAs and made the
expands wait on counters: benchmarks/RESULTS.md. Here no CTA waits on another.)

Rank-aware like the two-launch path: the smallest bucket RB in {16, 32, 64} holding the slot's rank, rows past
the rank masked (no bytes). Pools with ranks above 64 take the two-launch path (`fusable`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.blocks import FusedBlocks, fused_blocks, tile_index
from multilora_cli.kernels.checks import (
    check_meta,
    check_weights,
    check_x,
    num_sms,
    rank_bucket,
    tile_grid,
)
from multilora_cli.kernels.meta import LoraMeta
from multilora_cli.kernels.pdl import (
    LINE_BYTES,
    PREFETCH_LINES,
    launch_dependents,
    pdl_mode,
    prefetch_l2,
    wait_predecessor,
)
from multilora_cli.kernels.sgmv_expand import MAX_SLICES, _add_block, load_block
from multilora_cli.kernels.weights import LoraWeights

MAX_FUSED_RANK = 64


def fusable(w: LoraWeights) -> bool:
    """The fused kernel compiles rank buckets up to 64 and slices up to MAX_SLICES."""
    return w.max_rank <= MAX_FUSED_RANK and w.n_slices <= MAX_SLICES


@triton.jit
def _fused_bucket(x_ptr, a_row, b_slot, y_ptr, rows, row_ok, r, scale, K, n0, col_hi, nb,
                  stride_xt, stride_a_rank, stride_b_out, stride_b_rank, stride_yt,
                  BM: tl.constexpr, RB: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr, EVEN_K: tl.constexpr,
                  NB1: tl.constexpr, DOT_PREC: tl.constexpr):
    """r <= RB: s = scale * x[rows] @ a_row[:r]^T (fp32, whole K), then y[rows, n0 : n0 + nb*BN] += s @ B^T."""
    CD = y_ptr.dtype.element_ty
    offs_r = tl.arange(0, RB)
    j_ok = offs_r < r
    offs_k = tl.arange(0, BK)
    x_ptrs = x_ptr + rows[:, None] * stride_xt + offs_k[None, :]  # [BM, BK]
    a_ptrs = a_row + offs_r[None, :] * stride_a_rank + offs_k[:, None]  # [BK, RB]
    acc = tl.zeros((BM, RB), dtype=tl.float32)
    for k in range(0, K, BK):
        if EVEN_K:
            xt = tl.load(x_ptrs + k, mask=row_ok[:, None], other=0.0)
            at = tl.load(a_ptrs + k, mask=j_ok[None, :], other=0.0)
        else:
            k_ok = k + offs_k < K
            xt = tl.load(x_ptrs + k, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            at = tl.load(a_ptrs + k, mask=j_ok[None, :] & k_ok[:, None], other=0.0)
        acc = tl.dot(xt, at.to(xt.dtype), acc, input_precision=DOT_PREC)
    sv = (acc * scale).to(CD)  # [BM, RB]: rounded to y's dtype once, as the two-launch expand rounds s
    y_rows = y_ptr + rows[:, None] * stride_yt  # [BM, 1]
    b_base = b_slot + offs_r[:, None] * stride_b_rank  # [RB, 1]
    if NB1:
        cols = n0 + tl.arange(0, BN)
        col_ok = cols < col_hi
        ok = row_ok[:, None] & col_ok[None, :]
        bt, yv = load_block(b_base + cols[None, :] * stride_b_out, y_rows + cols[None, :], j_ok, col_ok, ok)
        _add_block(y_rows + cols[None, :], yv, sv, bt, ok, DOT_PREC)
    else:
        for it in range(nb):
            cols = n0 + it * BN + tl.arange(0, BN)
            col_ok = cols < col_hi
            ok = row_ok[:, None] & col_ok[None, :]
            bt, yv = load_block(b_base + cols[None, :] * stride_b_out, y_rows + cols[None, :], j_ok, col_ok, ok)
            _add_block(y_rows + cols[None, :], yv, sv, bt, ok, DOT_PREC)


@triton.jit(do_not_specialize=["tile_cap", "nb"])  # vary with the metadata / table: no compile per value
def _fused_kernel(
    x_ptr, a_ptr, b_ptr, rank_ptr, scale_ptr, idx_ptr, tiles_ptr, y_ptr,
    K, tile_cap, n_slices, nb, O1, O2, O3, O4,
    stride_xt, stride_a_slot, stride_a_slice, stride_a_rank, stride_b_slot, stride_b_out, stride_b_rank, stride_yt,
    BM: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr, MAX_RB: tl.constexpr, EVEN_K: tl.constexpr,
    NB1: tl.constexpr, DOT_PREC: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr, PF_LINES: tl.constexpr, LINE: tl.constexpr,
):
    pid_g = tl.program_id(0)  # tiles on the slow axis: a graph's padding tiles are dispatched last
    pid_tile = tl.program_id(1)
    first = (pid_tile == 0) & (pid_g == 0)
    slot = tl.load(tiles_ptr + pid_tile)
    if slot < 0:  # padding tile of a static grid
        if first:
            wait_predecessor(PDL)  # the grid's first CTA always waits (see pdl.py)
        return
    lo = tl.load(tiles_ptr + tile_cap + pid_tile)
    hi = tl.load(tiles_ptr + 2 * tile_cap + pid_tile)
    slot64 = slot.to(tl.int64)
    # column groups are numbered slice after slice (see sgmv_expand.py): which slice owns pid_g
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
    scale = tl.load(scale_ptr + slot64 * n_slices + sl)
    m = tl.arange(0, BM)
    row_ok = lo + m < hi
    rows = tl.load(idx_ptr + lo + m, mask=row_ok, other=0).to(tl.int64)  # [BM] token ids
    a_row = a_ptr + slot64 * stride_a_slot + sl * stride_a_slice  # A[slot, sl]: [R, K], rank rows contiguous in K
    b_slot = b_ptr + slot64 * stride_b_slot
    n0 = col_lo + (pid_g - g_lo) * gw
    if PREFETCH:  # A is static during the step: pull the first lines of this CTA's rank rows while waiting
        pj = tl.arange(0, 16)
        pk = tl.arange(0, PF_LINES) * LINE
        prefetch_l2(a_row, pj[:, None] * stride_a_rank + pk[None, :], (pj < r)[:, None] & (pk < K)[None, :])
    wait_predecessor(PDL)  # x and y belong to earlier kernels
    launch_dependents(PDL)
    if r <= 16:
        _fused_bucket(x_ptr, a_row, b_slot, y_ptr, rows, row_ok, r, scale, K, n0, col_hi, nb,
                      stride_xt, stride_a_rank, stride_b_out, stride_b_rank, stride_yt,
                      BM, 16, BK, BN, EVEN_K, NB1, DOT_PREC)
    else:
        if MAX_RB >= 32:  # compile-time: buckets above the pool's max rank are not compiled
            if r <= 32:
                _fused_bucket(x_ptr, a_row, b_slot, y_ptr, rows, row_ok, r, scale, K, n0, col_hi, nb,
                              stride_xt, stride_a_rank, stride_b_out, stride_b_rank, stride_yt,
                              BM, 32, max(BK // 2, 32), BN, EVEN_K, NB1, DOT_PREC)
            else:
                if MAX_RB >= 64:
                    _fused_bucket(x_ptr, a_row, b_slot, y_ptr, rows, row_ok, r, scale, K, n0, col_hi, nb,
                                  stride_xt, stride_a_rank, stride_b_out, stride_b_rank, stride_yt,
                                  BM, 64, max(BK // 4, 32), BN, EVEN_K, NB1, DOT_PREC)


def default_fused_blocks(x: torch.Tensor, w: LoraWeights) -> FusedBlocks | None:
    return fused_blocks(x.shape[0], w.in_features, w.out_features, w.n_slices, w.max_rank, num_sms(x.device))


def add_lora_fused(y: torch.Tensor, x: torch.Tensor, w: LoraWeights, meta: LoraMeta, blocks: FusedBlocks) -> None:
    """`add_lora` in one launch (same semantics as `add_lora_triton`), in place. `fusable(w)` must hold.

    x:    [T, in]   fp16 | bf16 | fp32, row stride free, unit column stride
    y:    [T, out]  same dtype family, unit column stride; updated in place
    w:    LoraWeights (a [L, n_slices, R, in], b [L, out, R] rank-major, rank/scale [L, n_slices]), R <= 64
    meta: LoraMeta of the step (tiles on y's device)

        for tile (slot, rows) in meta, for slice i with r = rank[slot, i] > 0, for column group g of slice i:
            s = scale[slot, i] * x[rows] @ a[slot, i, :r].T            (fp32 accumulate over all of in)
            y[rows, g] += s.to(y.dtype) @ b[slot, g, :r].T             (fp32 accumulate, added in fp32, rounded once)
    Rows of base tokens and columns of rank-0 slices are not written.
    """
    t = check_x(x, w.in_features, "x")
    if check_x(y, w.out_features, "y") != t:
        raise ValueError(f"add_lora_fused: x has {t} rows, y {y.shape[0]}")
    check_weights(w, y.device)
    check_meta(meta, t, y.device)
    if not fusable(w):
        raise ValueError(f"add_lora_fused: pool max_rank {w.max_rank} / {w.n_slices} slices not fusable "
                         f"(max rank {MAX_FUSED_RANK}, {MAX_SLICES} slices)")
    b = blocks
    n_tiles = tile_grid(meta, b.bm, t, w.max_loras)
    if n_tiles == 0:
        return
    offs = list(w.slice_offsets[1:-1]) + [w.out_features] * (MAX_SLICES - w.n_slices + 1)  # O1..O4
    gw = b.bn * b.nb
    groups = sum(triton.cdiv(w.slice_offsets[i + 1] - w.slice_offsets[i], gw) for i in range(w.n_slices))
    tiles = meta.tiles[tile_index(b.bm)]
    pdl = pdl_mode(y.device, t)
    line = LINE_BYTES // w.a.element_size()
    pf_lines = triton.next_power_of_2(max(1, min(triton.cdiv(w.in_features, line), PREFETCH_LINES // 16)))
    _fused_kernel[(groups, n_tiles)](
        x, w.a, w.b, w.rank, w.scale, meta.sorted_idx, tiles, y,
        w.in_features, tiles.stride(0), w.n_slices, b.nb, *offs,
        x.stride(0), w.a.stride(0), w.a.stride(1), w.a.stride(2), w.b.stride(0), w.b.stride(1), w.b.stride(2),
        y.stride(0),
        BM=b.bm, BK=b.bk, BN=b.bn, MAX_RB=rank_bucket(w.max_rank), EVEN_K=w.in_features % b.bk == 0,
        NB1=b.nb == 1, DOT_PREC="ieee" if y.dtype == torch.float32 else "tf32",
        PDL=pdl.launch, PREFETCH=pdl.prefetch, PF_LINES=pf_lines if pdl.prefetch else 1, LINE=line,
        num_warps=b.num_warps, num_stages=b.num_stages, **pdl.kwargs(),
    )
