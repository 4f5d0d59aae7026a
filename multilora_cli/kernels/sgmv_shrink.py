"""SGMV shrink: s = scale * x @ A^T for every token's adapter, all packed slices in one launch.

Grid: (K splits, rank chunks of 64, tiles). A tile is up to BM rows of ONE segment (one slot), so each
CTA streams one adapter's A once for its rows. The CTA's N dimension holds every slice at once
(NSP slices x RB rank rows), so the x tile is read once per K step for all slices. Rank-aware: the CTA
picks the smallest bucket RB in {16, 32, 64} holding the slot's largest slice rank (FLOPs padded to that
bucket only), rows of A past each slice's rank are masked (no bytes), and ranks above 64 add chunks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.blocks import ShrinkBlocks, shrink_blocks, tile_index
from multilora_cli.kernels.checks import check_meta, check_weights, check_x, num_sms, rank_bucket, tile_grid
from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.meta import LoraMeta
from multilora_cli.kernels.pdl import (
    LINE_BYTES,
    PREFETCH_LINES,
    launch_dependents,
    pdl_mode,
    prefetch_l2,
    wait_predecessor,
)
from multilora_cli.kernels.weights import LoraWeights


@triton.jit
def _shrink_bucket(
    x_ptr,
    a_slot,
    rank_row,
    scale_row,
    s_out,
    rows,
    row_ok,
    k_lo,
    k_hi,
    n_slices,
    base,
    stride_xt,
    stride_a_slice,
    stride_a_rank,
    stride_s_t,
    stride_s_slice,
    EVEN_K: tl.constexpr,
    NSP: tl.constexpr,
    BM: tl.constexpr,
    RB: tl.constexpr,
    BK: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """s_out[rows, i, base + j] = scale_i * x[rows, k_lo:k_hi] @ a[i, base + j, k_lo:k_hi]^T for j < RB."""
    n = tl.arange(0, NSP * RB)  # column n = (slice n // RB, rank row base + n % RB)
    sl = n // RB
    j = base + n % RB
    sl_ok = sl < n_slices
    r = tl.load(rank_row + sl, mask=sl_ok, other=0)
    col_ok = j < r
    offs_k = tl.arange(0, BK)
    x_ptrs = x_ptr + rows[:, None] * stride_xt + offs_k[None, :]  # [BM, BK]
    a_ptrs = a_slot + sl[None, :] * stride_a_slice + j[None, :] * stride_a_rank + offs_k[:, None]  # [BK, NSP*RB]
    acc = tl.zeros((BM, NSP * RB), dtype=tl.float32)
    for k in range(k_lo, k_hi, BK):
        if EVEN_K:
            xt = tl.load(x_ptrs + k, mask=row_ok[:, None], other=0.0)
            at = tl.load(a_ptrs + k, mask=col_ok[None, :], other=0.0)
        else:
            k_ok = k + offs_k < k_hi
            xt = tl.load(x_ptrs + k, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            at = tl.load(a_ptrs + k, mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        acc = tl.dot(xt, at.to(xt.dtype), acc, input_precision=DOT_PREC)
    scale = tl.load(scale_row + sl, mask=sl_ok, other=0.0)
    acc = acc * scale[None, :]
    s_ptrs = s_out + rows[:, None] * stride_s_t + sl[None, :] * stride_s_slice + j[None, :]
    tl.store(s_ptrs, acc, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["tile_cap"])  # an offset that varies with the metadata: no variant per value
def _shrink_kernel(
    x_ptr,
    a_ptr,
    rank_ptr,
    scale_ptr,
    idx_ptr,
    tiles_ptr,
    s_ptr,
    K,
    k_per_split,
    tile_cap,
    n_slices,
    stride_xt,
    stride_a_slot,
    stride_a_slice,
    stride_a_rank,
    stride_s_split,
    stride_s_t,
    stride_s_slice,
    NSP: tl.constexpr,
    NSPM: tl.constexpr,
    BM: tl.constexpr,
    BK: tl.constexpr,
    BK32: tl.constexpr,
    BK64: tl.constexpr,
    MAX_RB: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    PF_R: tl.constexpr,
    PF_LINES: tl.constexpr,
    LINE: tl.constexpr,
):
    # tiles on the slowest grid axis: a graph's padding tiles (static grid) are dispatched after all real work,
    # instead of interleaved with it (256 tokens / 16 adapters: 61.1 -> 53.0 us per layer on H200)
    pid_k = tl.program_id(0)
    pid_c = tl.program_id(1)
    pid_tile = tl.program_id(2)
    first = (pid_tile == 0) & (pid_c == 0) & (pid_k == 0)
    # the tile and its token ids are loaded before any branch: slot, lo and hi in one round trip, the rows in
    # the next (a padding tile has lo == hi: the row load is fully masked)
    slot = tl.load(tiles_ptr + pid_tile)
    lo = tl.load(tiles_ptr + tile_cap + pid_tile)
    hi = tl.load(tiles_ptr + 2 * tile_cap + pid_tile)
    m = tl.arange(0, BM)
    row_ok = lo + m < hi
    rows = tl.load(idx_ptr + lo + m, mask=row_ok, other=0).to(tl.int64)  # [BM] token ids
    if slot < 0:  # padding tile: no work (the grid is sized from a static bound)
        if first:
            wait_predecessor(PDL)  # the grid's first CTA always waits (see pdl.py)
        return
    slot64 = slot.to(tl.int64)
    rank_row = rank_ptr + slot64 * n_slices
    scale_row = scale_ptr + slot64 * n_slices
    ii = tl.arange(0, NSPM)
    base = pid_c * 64  # this CTA's rank rows: [base, base + 64)
    left = tl.max(tl.load(rank_row + ii, mask=ii < n_slices, other=0), 0) - base  # rank rows left to do
    if left <= 0:  # chunk past every slice's rank (or an all-zero slot)
        if first:
            wait_predecessor(PDL)
        return
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    a_slot = a_ptr + slot64 * stride_a_slot
    if PREFETCH:  # A is static during the step: fetch this CTA's lines while the predecessor finishes
        pn = tl.arange(0, NSP * PF_R)
        psl = pn // PF_R
        pj = base + pn % PF_R
        pok = (psl < n_slices) & (pj < tl.load(rank_row + psl, mask=psl < n_slices, other=0))  # [NSP*PF_R]
        pk = k_lo + tl.arange(0, PF_LINES) * LINE  # [PF_LINES]
        prefetch_l2(
            a_slot,
            psl[:, None] * stride_a_slice + pj[:, None] * stride_a_rank + pk[None, :],
            pok[:, None] & (pk < k_hi)[None, :],
        )
    wait_predecessor(PDL)  # x (and the s buffer's memory) belong to earlier kernels
    launch_dependents(PDL)  # only now: at most two grids of the chain hold SM slots at a time
    s_out = s_ptr + pid_k * stride_s_split
    # smallest rank bucket holding the rows left; K step shrinks as the bucket grows (same tile bytes)
    if left <= 16:
        _shrink_bucket(
            x_ptr,
            a_slot,
            rank_row,
            scale_row,
            s_out,
            rows,
            row_ok,
            k_lo,
            k_hi,
            n_slices,
            base,
            stride_xt,
            stride_a_slice,
            stride_a_rank,
            stride_s_t,
            stride_s_slice,
            EVEN_K,
            NSP,
            BM,
            16,
            BK,
            DOT_PREC,
        )
    else:
        if MAX_RB >= 32:  # compile-time: buckets above the pool's max rank are not compiled
            if left <= 32:
                _shrink_bucket(
                    x_ptr,
                    a_slot,
                    rank_row,
                    scale_row,
                    s_out,
                    rows,
                    row_ok,
                    k_lo,
                    k_hi,
                    n_slices,
                    base,
                    stride_xt,
                    stride_a_slice,
                    stride_a_rank,
                    stride_s_t,
                    stride_s_slice,
                    EVEN_K,
                    NSP,
                    BM,
                    32,
                    BK32,
                    DOT_PREC,
                )
            else:
                if MAX_RB >= 64:
                    _shrink_bucket(
                        x_ptr,
                        a_slot,
                        rank_row,
                        scale_row,
                        s_out,
                        rows,
                        row_ok,
                        k_lo,
                        k_hi,
                        n_slices,
                        base,
                        stride_xt,
                        stride_a_slice,
                        stride_a_rank,
                        stride_s_t,
                        stride_s_slice,
                        EVEN_K,
                        NSP,
                        BM,
                        64,
                        BK64,
                        DOT_PREC,
                    )


def shrink_out_shape(x: torch.Tensor, w: LoraWeights, blocks: ShrinkBlocks | None = None) -> tuple[int, int, int, int]:
    """Shape of the fp32 partial-sum buffer `lora_shrink` writes: [split, T, n_slices, max_rank]."""
    b = blocks or default_shrink_blocks(x, w)
    return (b.split, x.shape[0], w.n_slices, w.max_rank)


def default_shrink_blocks(x: torch.Tensor, w: LoraWeights) -> ShrinkBlocks:
    return shrink_blocks(x.shape[0], w.in_features, w.n_slices, w.max_rank, num_sms(x.device))


def lora_shrink(
    x: torch.Tensor, w: LoraWeights, meta: LoraMeta, out: torch.Tensor, blocks: ShrinkBlocks | None = None
) -> None:
    """Shrink every adapted token onto its adapter's rank space, all slices in one launch.

    x:    [T, in]                         fp16 | bf16 | fp32, row stride free, unit column stride
    w:    LoraWeights (a [L, n_slices, R, in], rank/scale [L, n_slices]); any float dtype (cast to x's)
    meta: LoraMeta of the step (tiles on x's device)
    out:  [split, T, n_slices, R]         fp32, split == blocks.split (see `shrink_out_shape`)

        for tile (slot, rows) in meta, for slice i with r = rank[slot, i] > 0, for split p:
            out[p, rows, i, :r] = scale[slot, i] * x[rows, K_p] @ a[slot, i, :r, K_p].T   (fp32 accumulate)
        where K_p is the p-th chunk of in-features, so that  s = out.sum(0).
    Entries of `out` for base tokens, for j >= rank and for rank-0 slices are left untouched.
    """
    b = blocks or default_shrink_blocks(x, w)
    t = check_x(x, w.in_features, "x")
    check_weights(w, x.device)
    check_meta(meta, t, x.device)
    if out.dtype != torch.float32 or tuple(out.shape) != (b.split, t, w.n_slices, w.max_rank) or out.stride(3) != 1:
        raise ValueError(
            f"lora_shrink: out must be fp32 {(b.split, t, w.n_slices, w.max_rank)} with unit last stride,"
            f" got {out.dtype} {tuple(out.shape)} strides {out.stride()}"
        )
    if out.device != x.device:
        raise ValueError(f"lora_shrink: out on {out.device}, x on {x.device}")
    n_tiles = tile_grid(meta, b.bm, t, w.max_loras)
    if n_tiles == 0:
        return
    k_per_split = -(-w.in_features // (b.split * b.bk)) * b.bk
    nsp = triton.next_power_of_2(w.n_slices)
    grid = (b.split, triton.cdiv(w.max_rank, 64), n_tiles)
    tiles = meta.tiles[tile_index(b.bm)]
    pdl = pdl_mode(x.device, t)
    line = LINE_BYTES // w.a.element_size()
    pf_r = min(rank_bucket(w.max_rank), 64)
    pf_lines = max(1, min(triton.cdiv(k_per_split, line), PREFETCH_LINES // (nsp * pf_r)))
    launch(
        _shrink_kernel,
        grid,
        x,
        w.a,
        w.rank,
        w.scale,
        meta.sorted_idx,
        tiles,
        out,
        w.in_features,
        k_per_split,
        tiles.stride(0),
        w.n_slices,
        x.stride(0),
        w.a.stride(0),
        w.a.stride(1),
        w.a.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        NSP=nsp,
        NSPM=max(nsp, 16),
        BM=b.bm,
        BK=b.bk,
        BK32=max(b.bk // 2, 32),
        BK64=max(b.bk // 4, 32),
        MAX_RB=min(rank_bucket(w.max_rank), 64),
        EVEN_K=w.in_features % k_per_split == 0,
        DOT_PREC="ieee" if x.dtype == torch.float32 else "tf32",
        PDL=pdl.launch,
        PREFETCH=pdl.prefetch,
        PF_R=pf_r,
        PF_LINES=triton.next_power_of_2(pf_lines) if pdl.prefetch else 1,
        LINE=line,
        num_warps=b.num_warps,
        num_stages=b.num_stages,
        **pdl.kwargs(),
    )
