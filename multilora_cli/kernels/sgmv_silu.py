"""SGMV expand fused with SiLU-and-mul: h = silu(gate + delta_gate) * (up + delta_up) for a [gate | up] layer.

`lora_expand` then `silu_mul` touch the matmul output y [T, 2I] three times (the expand reads and writes it,
the activation reads it again); this kernel reads y once and writes only h [T, I]. At 256 tokens of
Llama-3-8B that is 29 MB and one launch less per layer; at an 8k-token prefill step, 0.9 GB. The rounding is
the unfused path's: y + delta rounded to y's dtype, silu(gate) to the activation dtype, the product once more.

Grid: (column blocks of I, adapted tiles, then base tiles). A tile CTA takes one tile (rows of one slot) and
BN columns of both slices (gate at c, up at I + c). Base CTAs come after every tile on the slow axis (as
padding does in the other kernels) and cover sorted_idx[num_adapted:] BM rows at a time, with no delta:
every row of h is written by this one launch, whatever the adapter mix of a graph replay.

Rank-aware as the expand: a tile takes the smallest bucket RB in {16, 32, 64} holding both slices' ranks. At
64-256 tokens the larger buckets walk their BN columns in narrower steps (`blocks.silu_bucket_columns`), so
their B tiles cost no more registers and shared memory than twice the rank-16 bucket's: a kernel is allocated
for its largest branch, and in a rank-64 pool that set every CTA's occupancy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.blocks import SiluBlocks, silu_blocks, silu_bucket_columns, tile_index
from multilora_cli.kernels.checks import capturing, check_meta, check_weights, check_x, rank_bucket, tile_grid
from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.meta import LoraMeta
from multilora_cli.kernels.norm_rope import silu_mul_store
from multilora_cli.kernels.pdl import launch_dependents, pdl_mode, wait_predecessor
from multilora_cli.kernels.sgmv_expand import _load_s, load_block, partial_sum_args
from multilora_cli.kernels.weights import LoraWeights


@triton.jit
def _add_and_store(
    h_ptrs, yg, yu, sg, su, bg, bu, ok, d_g, cols, col_ok, I, DOT_PREC: tl.constexpr, DORA: tl.constexpr
):
    """h = silu(g) * u of g = yg + sg @ bg and u = yu + su @ bu, each rounded to y's dtype as the expand rounds;
    DORA: g and u then times the slot's DoRA scales d_g[cols] / d_g[I + cols], rounded again (as kernels/dora.py
    rounds after the expand)."""
    CD = sg.dtype
    g = (yg.to(tl.float32) + tl.dot(sg, bg.to(CD), input_precision=DOT_PREC)).to(CD)
    u = (yu.to(tl.float32) + tl.dot(su, bu.to(CD), input_precision=DOT_PREC)).to(CD)
    if DORA:
        dg = tl.load(d_g + cols, mask=col_ok, other=1.0)
        du = tl.load(d_g + I + cols, mask=col_ok, other=1.0)
        g = (g.to(tl.float32) * dg[None, :]).to(CD)
        u = (u.to(tl.float32) * du[None, :]).to(CD)
    silu_mul_store(h_ptrs, g, u, ok)


@triton.jit
def _tile(
    s_rows,
    stride_s_split,
    stride_s_slice,
    n_split,
    b_slot,
    stride_b_out,
    stride_b_rank,
    y_rows,
    h_rows,
    row_ok,
    c0,
    I,
    r_g,
    r_u,
    d_g,
    PDL: tl.constexpr,
    EARLY: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DORA: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    SUB: tl.constexpr,
    RB: tl.constexpr,
    SPLIT: tl.constexpr,
    VEC: tl.constexpr,
):
    """One tile over columns [c0, c0 + BN) of both slices, ranks r_g, r_u <= RB (0: that slice has no delta).
    SUB == BN (the rank-16 bucket): straight-line, B and y before the wait with EARLY. SUB < BN (larger buckets):
    s loaded once, then BN / SUB steps of [RB, SUB] B tiles, so no branch needs more registers or shared memory
    than the rank-16 one (see blocks.silu_bucket_columns)."""
    CD = y_rows.dtype.element_ty
    offs_r = tl.arange(0, RB)
    jg, ju = offs_r < r_g, offs_r < r_u
    b_r = b_slot + offs_r[:, None] * stride_b_rank  # [RB, 1]
    if SUB == BN:
        cols = c0 + tl.arange(0, BN)
        col_ok = cols < I
        ok = row_ok[:, None] & col_ok[None, :]
        b_g = b_r + cols[None, :] * stride_b_out  # [RB, BN]
        y_g = y_rows + cols[None, :]
        if EARLY:  # safe right after the shrink: see sgmv_expand._stream_columns
            bg, yg = load_block(b_g, y_g, jg, col_ok, ok)
            bu, yu = load_block(b_g + I * stride_b_out, y_g + I, ju, col_ok, ok)
        wait_predecessor(PDL)  # s comes from the shrink
        launch_dependents(PDL)
        if not EARLY:
            bg, yg = load_block(b_g, y_g, jg, col_ok, ok)
            bu, yu = load_block(b_g + I * stride_b_out, y_g + I, ju, col_ok, ok)
        sg = _load_s(s_rows, stride_s_split, n_split, offs_r, row_ok, jg, BM, RB, SPLIT, VEC).to(CD)
        su = _load_s(s_rows + stride_s_slice, stride_s_split, n_split, offs_r, row_ok, ju, BM, RB, SPLIT, VEC).to(CD)
        _add_and_store(h_rows + cols[None, :], yg, yu, sg, su, bg, bu, ok, d_g, cols, col_ok, I, DOT_PREC, DORA)
    else:
        wait_predecessor(PDL)
        launch_dependents(PDL)
        sg = _load_s(s_rows, stride_s_split, n_split, offs_r, row_ok, jg, BM, RB, SPLIT, VEC).to(CD)
        su = _load_s(s_rows + stride_s_slice, stride_s_split, n_split, offs_r, row_ok, ju, BM, RB, SPLIT, VEC).to(CD)
        for it in range(BN // SUB):
            cols = c0 + it * SUB + tl.arange(0, SUB)
            col_ok = cols < I
            ok = row_ok[:, None] & col_ok[None, :]
            b_g = b_r + cols[None, :] * stride_b_out  # [RB, SUB]
            bg, yg = load_block(b_g, y_rows + cols[None, :], jg, col_ok, ok)
            bu, yu = load_block(b_g + I * stride_b_out, y_rows + I + cols[None, :], ju, col_ok, ok)
            _add_and_store(h_rows + cols[None, :], yg, yu, sg, su, bg, bu, ok, d_g, cols, col_ok, I, DOT_PREC, DORA)


@triton.jit(do_not_specialize=["T", "n_split", "tile_cap", "n_tiles"])  # scalars: no compile per value class
def _expand_silu_kernel(
    s_ptr,
    b_ptr,
    rank_ptr,
    idx_ptr,
    tiles_ptr,
    nad_ptr,
    y_ptr,
    h_ptr,
    dora_ptr,
    T,
    I,
    n_split,
    tile_cap,
    n_tiles,
    stride_s_split,
    stride_s_t,
    stride_s_slice,
    stride_b_slot,
    stride_b_out,
    stride_b_rank,
    stride_yt,
    stride_ht,
    stride_dora,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BN32: tl.constexpr,
    BN64: tl.constexpr,
    MAX_RB: tl.constexpr,
    DOT_PREC: tl.constexpr,
    SPLIT: tl.constexpr,
    VEC: tl.constexpr,
    EARLY: tl.constexpr,
    PDL: tl.constexpr,
    DORA: tl.constexpr,
):
    pid_c = tl.program_id(0)
    pid_t = tl.program_id(1)  # tiles, then base tiles: on the slow axis, dispatched after the adapted rows
    first = (pid_t == 0) & (pid_c == 0)
    cols = pid_c * BN + tl.arange(0, BN)
    col_ok = cols < I
    m = tl.arange(0, BM)
    if pid_t >= n_tiles:  # base rows: no delta
        lo = tl.load(nad_ptr) + (pid_t - n_tiles) * BM
        if lo >= T:
            if first:
                wait_predecessor(PDL)  # the grid's first CTA always waits (see pdl.py)
            return
        row_ok = lo + m < T
        rows = tl.load(idx_ptr + lo + m, mask=row_ok, other=0).to(tl.int64)
        y_rows = y_ptr + rows[:, None] * stride_yt
        ok = row_ok[:, None] & col_ok[None, :]
        wait_predecessor(PDL)  # h may reuse memory a predecessor freed: write only after the wait
        launch_dependents(PDL)
        g = tl.load(y_rows + cols[None, :], mask=ok, other=0.0)
        u = tl.load(y_rows + I + cols[None, :], mask=ok, other=0.0)
        silu_mul_store(h_ptr + rows[:, None] * stride_ht + cols[None, :], g, u, ok)
        return
    # tile and token ids before any branch (as in the shrink): two round trips to the rows, not three
    slot = tl.load(tiles_ptr + pid_t)
    lo = tl.load(tiles_ptr + tile_cap + pid_t)
    hi = tl.load(tiles_ptr + 2 * tile_cap + pid_t)
    row_ok = lo + m < hi
    rows = tl.load(idx_ptr + lo + m, mask=row_ok, other=0).to(tl.int64)  # [BM] token ids
    if slot < 0:  # padding tile of a graph's static grid
        if first:
            wait_predecessor(PDL)
        return
    slot64 = slot.to(tl.int64)
    r_g = tl.load(rank_ptr + slot64 * 2)
    r_u = tl.load(rank_ptr + slot64 * 2 + 1)
    s_rows = s_ptr + rows[:, None] * stride_s_t  # [BM, 1], slice 0
    b_slot = b_ptr + slot64 * stride_b_slot
    y_rows = y_ptr + rows[:, None] * stride_yt
    h_rows = h_ptr + rows[:, None] * stride_ht
    d_g = dora_ptr + slot64 * stride_dora  # DoRA scale row of the slot ([gate | up]); unread without DORA
    r = tl.maximum(r_g, r_u)  # smallest bucket holding both; a slot adapting neither still writes h
    c0 = pid_c * BN
    if r <= 16:
        _tile(
            s_rows,
            stride_s_split,
            stride_s_slice,
            n_split,
            b_slot,
            stride_b_out,
            stride_b_rank,
            y_rows,
            h_rows,
            row_ok,
            c0,
            I,
            r_g,
            r_u,
            d_g,
            PDL,
            EARLY,
            DOT_PREC,
            DORA,
            BM,
            BN,
            BN,
            16,
            SPLIT,
            VEC,
        )
    else:
        if MAX_RB >= 32:  # compile-time: buckets above the pool's max rank are not compiled
            if r <= 32:
                _tile(
                    s_rows,
                    stride_s_split,
                    stride_s_slice,
                    n_split,
                    b_slot,
                    stride_b_out,
                    stride_b_rank,
                    y_rows,
                    h_rows,
                    row_ok,
                    c0,
                    I,
                    r_g,
                    r_u,
                    d_g,
                    PDL,
                    EARLY,
                    DOT_PREC,
                    DORA,
                    BM,
                    BN,
                    BN32,
                    32,
                    SPLIT,
                    VEC,
                )
            else:
                if MAX_RB >= 64:
                    _tile(
                        s_rows,
                        stride_s_split,
                        stride_s_slice,
                        n_split,
                        b_slot,
                        stride_b_out,
                        stride_b_rank,
                        y_rows,
                        h_rows,
                        row_ok,
                        c0,
                        I,
                        r_g,
                        r_u,
                        d_g,
                        PDL,
                        EARLY,
                        DOT_PREC,
                        DORA,
                        BM,
                        BN,
                        BN64,
                        64,
                        SPLIT,
                        VEC,
                    )


def fusable(w: LoraWeights) -> bool:
    """Whether `lora_expand_silu_mul` serves this pool: two equal slices ([gate | up]), ranks up to 64."""
    return w.n_slices == 2 and w.slice_offsets[1] * 2 == w.out_features and w.max_rank <= 64


def lora_expand_silu_mul(
    s: torch.Tensor,
    w: LoraWeights,
    meta: LoraMeta,
    y: torch.Tensor,
    out: torch.Tensor,
    blocks: SiluBlocks | None = None,
    after_shrink: bool = False,
) -> None:
    """out = silu(y_gate + delta_gate) * (y_up + delta_up), every row (base rows without delta); y is only read.

    s:    [split, T, 2, R]   fp32, partial sums from `lora_shrink` of the same step
    w:    LoraWeights with 2 slices of I columns each (b [L, 2I, R]), R <= 64 (`fusable`)
    meta: LoraMeta of the step (tiles, sorted_idx and num_adapted on y's device)
    y:    [T, 2I]            fp16 | bf16 | fp32, unit column stride: the [gate | up] matmul output
    out:  [T, I]             y's dtype, unit column stride

        for token t with slot l = slot(t) (no delta where l < 0 or rank[l, i] == 0):
            g = round(y[t, :I] + s[:, t, 0, :r0].sum(0) @ b[l, :I, :r0].T)
            u = round(y[t, I:] + s[:, t, 1, :r1].sum(0) @ b[l, I:, :r1].T)
            with DoRA rows (w.dora not None, [L + 1, 2I] fp32): g = round(g * dora[l, :I]), u = round(u * dora[l, I:])
            out[t] = round(round(silu(g)) * u)           (round: to y's dtype; arithmetic in fp32)
    after_shrink: as in `lora_expand` (this launch directly follows the shrink that wrote s).
    """
    t = check_x(y, w.out_features, "y")
    check_weights(w, y.device)
    check_meta(meta, t, y.device)
    if not fusable(w):
        raise ValueError(
            f"lora_expand_silu_mul needs 2 equal slices and max_rank <= 64, got slices "
            f"{w.slice_offsets} max_rank {w.max_rank}"
        )
    i = w.out_features // 2
    if out.shape != (t, i) or out.dtype != y.dtype or (t and out.stride(1) != 1) or out.device != y.device:
        raise ValueError(
            f"lora_expand_silu_mul: out must be {y.dtype} [{t}, {i}] with unit column stride on "
            f"{y.device}, got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    if s.dim() != 4 or s.dtype != torch.float32 or tuple(s.shape[1:]) != (t, 2, w.max_rank) or s.stride(3) != 1:
        raise ValueError(
            f"lora_expand_silu_mul: s must be fp32 [split, {t}, 2, {w.max_rank}], got {s.dtype} {tuple(s.shape)}"
        )
    if meta.num_adapted is None:
        raise ValueError("LoraMeta has no num_adapted: build it with build_lora_meta or LoraMetaBuffers")
    if t == 0:
        return
    b = blocks or silu_blocks(t)
    n_tiles = tile_grid(meta, b.bm, t, w.max_loras)
    # base rows: under capture a bound (any later mix fits; CTAs past the base rows exit), else host-known
    base = t if capturing(y.device) else t - (meta.segments[-1][2] if meta.segments else 0)
    base_tiles = triton.cdiv(base, b.bm)
    if n_tiles + base_tiles == 0:
        return
    tiles = meta.tiles[tile_index(b.bm)]
    pdl = pdl_mode(y.device, t)
    bn32, bn64 = (silu_bucket_columns(b.bn, rb, t) for rb in (32, 64))
    launch(
        _expand_silu_kernel,
        (triton.cdiv(i, b.bn), n_tiles + base_tiles),
        s,
        w.b,
        w.rank,
        meta.sorted_idx,
        tiles,
        meta.num_adapted,
        y,
        out,
        w.dora if w.dora is not None else w.scale,  # unread without DORA
        t,
        i,
        s.shape[0],
        tiles.stride(0),
        n_tiles,
        s.stride(0),
        s.stride(1),
        s.stride(2),
        w.b.stride(0),
        w.b.stride(1),
        w.b.stride(2),
        y.stride(0),
        out.stride(0),
        w.dora.stride(0) if w.dora is not None else 0,
        BM=b.bm,
        BN=b.bn,
        BN32=bn32,
        BN64=bn64,
        MAX_RB=rank_bucket(w.max_rank),
        DOT_PREC="ieee" if y.dtype == torch.float32 else "tf32",
        EARLY=after_shrink,
        PDL=pdl.launch,
        DORA=w.dora is not None,
        num_warps=b.num_warps,
        num_stages=1,
        **partial_sum_args(s, t),
        **pdl.kwargs(),
    )
