"""SGMV shrink + expand in ONE launch: the expand CTAs stream B and y while the shrink CTAs are still running.

Why: at decode sizes (a few tokens per adapter) each of the two kernels is latency-bound: a launch, a chain
of dependent loads (tile -> rows/rank -> data) and a tail, ~8-10 us each whatever the bytes. One launch per
module pays that once, and the expand's B reads (the larger half of the bytes) overlap the shrink.

Grid (1-D, so CTAs are dispatched in program-id order): first every shrink CTA (tile, rank chunk, K split),
as in sgmv_shrink.py; then every expand CTA (tile, column group), as in sgmv_expand.py. An expand CTA loads
its tile's rows, rank, B block and y block, then waits on its tile's counter until all of that tile's shrink
CTAs have published their fp32 partials (release / acquire atomics), sums them in split order (the same
order as `lora_expand`, so results are bit-identical to the two-launch path), and adds s @ B^T into y. The
waits cannot deadlock: a CTA only waits on CTAs with smaller program ids, which were dispatched before it.
The last expand CTA of each tile returns both counters to zero, so `LoraMeta.counters` is ready for the
next layer and the next CUDA-graph replay without a memset.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.blocks import ExpandBlocks, ShrinkBlocks, tile_index
from multilora_cli.kernels.checks import check_meta, check_weights, check_x, rank_bucket, tile_grid
from multilora_cli.kernels.meta import LoraMeta
from multilora_cli.kernels.sgmv_expand import MAX_SLICES
from multilora_cli.kernels.sgmv_shrink import _shrink_bucket
from multilora_cli.kernels.weights import LoraWeights


@triton.jit
def _wait_for(cnt, target):
    n = tl.atomic_add(cnt, 0, sem="acquire")
    while n < target:
        n = tl.atomic_add(cnt, 0, sem="acquire")


@triton.jit
def _expand_after_wait(s_rows, stride_s_split, b_slot, stride_b_out, stride_b_rank, y_rows, row_ok, r, n0, col_hi,
                       nb, cnt, target, SPLIT: tl.constexpr, DOT_PREC: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, RB: tl.constexpr):
    """Column block 0's B and y are loaded BEFORE the wait (they do not depend on the shrink)."""
    CD = y_rows.dtype.element_ty
    offs_r = tl.arange(0, RB)
    j_ok = offs_r < r
    b_base = b_slot + offs_r[:, None] * stride_b_rank  # [RB, 1]
    cols = n0 + tl.arange(0, BN)
    col_ok = cols < col_hi
    ok = row_ok[:, None] & col_ok[None, :]
    yv = tl.load(y_rows + cols[None, :], mask=ok, other=0.0)  # [BM, BN]
    bt = tl.load(b_base + cols[None, :] * stride_b_out, mask=j_ok[:, None] & col_ok[None, :], other=0.0)  # [RB, BN]
    _wait_for(cnt, target)
    s_ok = row_ok[:, None] & j_ok[None, :]
    sv = tl.zeros((BM, RB), dtype=tl.float32)
    for p in tl.static_range(SPLIT):  # all partial loads in flight at once; .cg: from L2, never a stale L1 line
        sv += tl.load(s_rows + p * stride_s_split + offs_r[None, :], mask=s_ok, other=0.0, cache_modifier=".cg")
    sv = sv.to(CD)
    acc = tl.dot(sv, bt.to(CD), input_precision=DOT_PREC)  # [BM, BN] fp32
    tl.store(y_rows + cols[None, :], (yv.to(tl.float32) + acc).to(CD), mask=ok)
    for it in range(1, nb):
        cols = n0 + it * BN + tl.arange(0, BN)
        col_ok = cols < col_hi
        ok = row_ok[:, None] & col_ok[None, :]
        yv = tl.load(y_rows + cols[None, :], mask=ok, other=0.0)
        bt = tl.load(b_base + cols[None, :] * stride_b_out, mask=j_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(sv, bt.to(CD), input_precision=DOT_PREC)
        tl.store(y_rows + cols[None, :], (yv.to(tl.float32) + acc).to(CD), mask=ok)


@triton.jit
def _fused_kernel(
    x_ptr, a_ptr, b_ptr, rank_ptr, scale_ptr, idx_ptr, tiles_ptr, s_ptr, cnt_ptr, y_ptr,
    K, k_per_split, tile_cap, n_slices, n_tiles, groups, nb, O1, O2, O3, O4,
    stride_xt, stride_a_slot, stride_a_slice, stride_a_rank,
    stride_s_split, stride_s_t, stride_s_slice, stride_b_slot, stride_b_out, stride_b_rank, stride_yt,
    SPLIT: tl.constexpr, NSP: tl.constexpr, NSPM: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
    BK32: tl.constexpr, BK64: tl.constexpr, BN: tl.constexpr, MAX_RB: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    n_shrink = n_tiles * SPLIT
    if pid < n_shrink:  # ---- shrink CTA: (tile, K split)
        tile = pid // SPLIT
        pid_k = pid % SPLIT
        slot = tl.load(tiles_ptr + tile)
        if slot >= 0:  # slot -1: padding tile, nobody waits on it
            lo = tl.load(tiles_ptr + tile_cap + tile)
            hi = tl.load(tiles_ptr + 2 * tile_cap + tile)
            slot64 = slot.to(tl.int64)
            rank_row = rank_ptr + slot64 * n_slices
            scale_row = scale_ptr + slot64 * n_slices
            ii = tl.arange(0, NSPM)
            left = tl.max(tl.load(rank_row + ii, mask=ii < n_slices, other=0), 0)
            if left > 0:
                m = tl.arange(0, BM)
                row_ok = lo + m < hi
                rows = tl.load(idx_ptr + lo + m, mask=row_ok, other=0).to(tl.int64)  # [BM] token ids
                k_lo = pid_k * k_per_split
                k_hi = tl.minimum(K, k_lo + k_per_split)
                a_slot = a_ptr + slot64 * stride_a_slot
                s_out = s_ptr + pid_k * stride_s_split
                if left <= 16:
                    _shrink_bucket(x_ptr, a_slot, rank_row, scale_row, s_out, rows, row_ok, k_lo, k_hi, n_slices, 0,
                                   stride_xt, stride_a_slice, stride_a_rank, stride_s_t, stride_s_slice,
                                   EVEN_K, NSP, BM, 16, BK, DOT_PREC)
                else:
                    if MAX_RB >= 32:
                        if left <= 32:
                            _shrink_bucket(x_ptr, a_slot, rank_row, scale_row, s_out, rows, row_ok, k_lo, k_hi,
                                           n_slices, 0, stride_xt, stride_a_slice, stride_a_rank, stride_s_t,
                                           stride_s_slice, EVEN_K, NSP, BM, 32, BK32, DOT_PREC)
                        else:
                            if MAX_RB >= 64:
                                _shrink_bucket(x_ptr, a_slot, rank_row, scale_row, s_out, rows, row_ok, k_lo, k_hi,
                                               n_slices, 0, stride_xt, stride_a_slice, stride_a_rank, stride_s_t,
                                               stride_s_slice, EVEN_K, NSP, BM, 64, BK64, DOT_PREC)
            tl.debug_barrier()  # every thread's partial stores happen before the release below
            tl.atomic_add(cnt_ptr + tile, 1, sem="release")
    else:  # ---- expand CTA: (tile, column group)
        e = pid - n_shrink
        tile = e // groups
        pid_g = e % groups
        slot = tl.load(tiles_ptr + tile)
        if slot >= 0:
            lo = tl.load(tiles_ptr + tile_cap + tile)
            hi = tl.load(tiles_ptr + 2 * tile_cap + tile)
            slot64 = slot.to(tl.int64)
            gw = BN * nb
            g1 = tl.cdiv(O1, gw)
            g2 = g1 + tl.cdiv(O2 - O1, gw)
            g3 = g2 + tl.cdiv(O3 - O2, gw)
            sl = (pid_g >= g1).to(tl.int32) + (pid_g >= g2).to(tl.int32) + (pid_g >= g3).to(tl.int32)
            col_lo = tl.where(sl == 0, 0, tl.where(sl == 1, O1, tl.where(sl == 2, O2, O3)))
            col_hi = tl.where(sl == 0, O1, tl.where(sl == 1, O2, tl.where(sl == 2, O3, O4)))
            g_lo = tl.where(sl == 0, 0, tl.where(sl == 1, g1, tl.where(sl == 2, g2, g3)))
            r = tl.load(rank_ptr + slot64 * n_slices + sl)
            cnt = cnt_ptr + tile
            m = tl.arange(0, BM)
            row_ok = lo + m < hi
            rows = tl.load(idx_ptr + lo + m, mask=row_ok, other=0).to(tl.int64)  # [BM] token ids
            s_rows = s_ptr + rows[:, None] * stride_s_t + sl * stride_s_slice  # [BM, 1]
            b_slot = b_ptr + slot64 * stride_b_slot
            y_rows = y_ptr + rows[:, None] * stride_yt  # [BM, 1]
            n0 = col_lo + (pid_g - g_lo) * gw
            if r == 0:  # slice not adapted by this slot: nothing to add, but still part of the hand-off
                _wait_for(cnt, SPLIT)
            elif r <= 16:
                _expand_after_wait(s_rows, stride_s_split, b_slot, stride_b_out, stride_b_rank, y_rows, row_ok, r,
                                   n0, col_hi, nb, cnt, SPLIT, SPLIT, DOT_PREC, BM, BN, 16)
            else:
                if MAX_RB >= 32:
                    if r <= 32:
                        _expand_after_wait(s_rows, stride_s_split, b_slot, stride_b_out, stride_b_rank, y_rows,
                                           row_ok, r, n0, col_hi, nb, cnt, SPLIT, SPLIT, DOT_PREC, BM, BN, 32)
                    else:
                        if MAX_RB >= 64:
                            _expand_after_wait(s_rows, stride_s_split, b_slot, stride_b_out, stride_b_rank, y_rows,
                                               row_ok, r, n0, col_hi, nb, cnt, SPLIT, SPLIT, DOT_PREC, BM, BN, 64)
            # every expand CTA of the tile has waited (so every shrink CTA has counted) before the last resets
            done = tl.atomic_add(cnt_ptr + tile_cap + tile, 1, sem="acq_rel")
            if done == groups - 1:
                tl.store(cnt_ptr + tile, 0)
                tl.store(cnt_ptr + tile_cap + tile, 0)


def fused_supported(w: LoraWeights, meta: LoraMeta) -> bool:
    """The one-launch path covers pools of max_rank <= 64 with <= 4 slices and metadata that has counters."""
    return w.max_rank <= 64 and w.n_slices <= MAX_SLICES and meta.counters is not None


def lora_fused(y: torch.Tensor, x: torch.Tensor, w: LoraWeights, meta: LoraMeta, shrink: ShrinkBlocks,
               expand: ExpandBlocks) -> None:
    """Same result as `lora_shrink` then `lora_expand` (bit for bit), in one launch. In place on y.

    x:    [T, in]   fp16 | bf16 | fp32, unit column stride
    y:    [T, out]  same dtype family as x, unit column stride; updated
    w:    LoraWeights with max_rank <= 64 and n_slices <= 4
    meta: LoraMeta with `counters` [2, cap] int32, all zero (they are zero again when the kernel ends)
    shrink.bm must equal expand.bm (both walk the same tile map).

        s[p] = lora_shrink partials (fp32, [split, T, n_slices, R], a scratch buffer)
        for tile (slot, rows), for slice i with r = rank[slot, i] > 0:
            y[rows, off_i:off_i+n_i] += (sum_p s[p, rows, i, :r]) @ b[slot, off_i:off_i+n_i, :r].T
    """
    t = check_x(x, w.in_features, "x")
    if check_x(y, w.out_features, "y") != t:
        raise ValueError(f"lora_fused: x has {t} rows, y has {y.shape[0]}")
    check_weights(w, x.device)
    check_meta(meta, t, x.device)
    if not fused_supported(w, meta):
        raise ValueError("lora_fused needs max_rank <= 64, <= 4 slices and LoraMeta.counters")
    if shrink.bm != expand.bm:
        raise ValueError(f"lora_fused: shrink bm {shrink.bm} != expand bm {expand.bm}")
    tiles = meta.tiles[tile_index(shrink.bm)]
    if tuple(meta.counters.shape) != (2, tiles.shape[1]) or meta.counters.dtype != torch.int32:
        raise ValueError(f"lora_fused: counters must be int32 [2, {tiles.shape[1]}], got {tuple(meta.counters.shape)}")
    n_tiles = tile_grid(meta, shrink.bm, t, w.max_loras)
    if n_tiles == 0:
        return
    split = shrink.split
    s = torch.empty((split, t, w.n_slices, w.max_rank), dtype=torch.float32, device=x.device)
    k_per_split = -(-w.in_features // (split * shrink.bk)) * shrink.bk
    nsp = triton.next_power_of_2(w.n_slices)
    gw = expand.bn * expand.nb
    groups = sum(triton.cdiv(w.slice_offsets[i + 1] - w.slice_offsets[i], gw) for i in range(w.n_slices))
    offs = list(w.slice_offsets[1:-1]) + [w.out_features] * (MAX_SLICES - w.n_slices + 1)  # O1..O4
    grid = (n_tiles * split + n_tiles * groups,)
    _fused_kernel[grid](
        x, w.a, w.b, w.rank, w.scale, meta.sorted_idx, tiles, s, meta.counters, y,
        w.in_features, k_per_split, tiles.stride(0), w.n_slices, n_tiles, groups, expand.nb, *offs,
        x.stride(0), w.a.stride(0), w.a.stride(1), w.a.stride(2),
        s.stride(0), s.stride(1), s.stride(2), w.b.stride(0), w.b.stride(1), w.b.stride(2), y.stride(0),
        SPLIT=split, NSP=nsp, NSPM=max(nsp, 16), BM=shrink.bm, BK=shrink.bk, BK32=max(shrink.bk // 2, 32),
        BK64=max(shrink.bk // 4, 32), BN=expand.bn, MAX_RB=rank_bucket(w.max_rank),
        EVEN_K=w.in_features % k_per_split == 0, DOT_PREC="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=max(shrink.num_warps, expand.num_warps), num_stages=shrink.num_stages,
    )
