"""Expert-LoRA kernels grouped by (expert, adapter slot) (kernels/moe_align.py's `by (expert, slot)` order): the
shrink of every step, and the expand of steps too large for `kernels/moe_gemm.py`'s per-row expand.

    _shrink: out[p, sl*R + j] = scale[s, sl*R + j] * src[row(p)] @ a[s, e, sl*R + j]^T     j < rank[s], NSL slices
             src [T or T*K, KD], a [L, E, NSL*R, KD], scale [L, NSL*R] fp32, out [T*K, NSL*R] in src's dtype
    _expand: v = in[p, n] + sh[p] @ b[s, e, n]^T (the LoRA term only for s >= 0 and rank[s] > 0);
             SILU: out[p, n] = silu(v) * (in[p, N + n] + sh[p, R:] @ b[s, e, N + n, :]^T),  out [T*K, N]
             else: out[p, n] = v * rw[p]                                                     out [T*K, N]

One program per (expert, slot) of rows (the shrink finds them three ways: `MODE`): the rows share one adapter's
factors of one expert, so they are read once with tensor-core dots. Torch reference: kernels/moe_reference.py (the
tests go through fused_moe).
"""

from __future__ import annotations

import triton
import triton.language as tl

from multilora_cli.kernels.checks import rank_bucket
from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.moe_align import MoeAlign
from multilora_cli.kernels.pdl import PdlMode, launch_dependents, wait_predecessor

BN, BK = 64, 64


@triton.jit
def _shrink_rows(
    src_ptr, a_base, scale_ptr, out_ptr, pair, ok, s, r, shared, top_k, R, KD, stride_src, stride_a_row, stride_scale,
    stride_out, GATHER: tl.constexpr, NSL: tl.constexpr, RB: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    """The shrink of one tile of BM rows (pair ids, ok = real rows) of one (expert, slot):
    out[p] = scale * src @ a^T."""
    if GATHER:
        src_row = pair // top_k
    else:
        src_row = pair
    c = tl.arange(0, NSL * RB)
    col = (c // RB) * R + c % RB
    col_ok = c % RB < r
    read = col_ok  # the A rows read
    if NSL == 2:
        read = col_ok & (c < tl.where(shared != 0, RB, 2 * RB))  # shared: slice 0's rows only
    acc = tl.zeros((BM, NSL * RB), dtype=tl.float32)
    for k in range(0, KD, BK):
        kk = k + tl.arange(0, BK)
        k_ok = kk < KD
        xt = tl.load(src_ptr + src_row[:, None] * stride_src + kk[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
        at = tl.load(a_base + col[None, :] * stride_a_row + kk[:, None], mask=read[None, :] & k_ok[:, None], other=0.0)
        acc = tl.dot(xt, at.to(xt.dtype), acc, input_precision=DOT_PREC)
    acc = acc * tl.load(scale_ptr + s * stride_scale + col, mask=col_ok, other=0.0)[None, :]
    out = out_ptr + pair[:, None] * stride_out + col[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=ok[:, None] & read[None, :])
    if NSL == 2:  # shared: slice 0's columns again as slice 1's (their scales are equal by the flag's definition)
        tl.store(
            out + R,
            acc.to(out_ptr.dtype.element_ty),
            mask=ok[:, None] & (col_ok & (c < tl.where(shared != 0, RB, 0)))[None, :],
        )


# the shrink's work split (MODE): one (expert, adapter) of rows per program, found three ways
BLOCKS = 0  # program b: block b of an alignment by (expert, slot) (the grouped path)
BLOCK_SLOTS = 1  # program (b, j): the j-th distinct adapter of by-expert block b (decode-sized steps)
GROUPS = 2  # program g: group g's contiguous rows of any alignment, BM at a time (prefill-sized steps)


@triton.jit
def _lora_shrink_kernel(
    src_ptr, a_ptr, scale_ptr, rank_ptr, shared_ptr, pair_ptr, bexp_ptr, bslot_ptr, slot_ptr, gend_ptr, gcount_ptr,
    out_ptr, KD, top_k, R, n_slot,
    stride_src, stride_a_slot, stride_a_exp, stride_a_row, stride_scale, stride_out,
    GATHER: tl.constexpr, MODE: tl.constexpr, NSL: tl.constexpr, RB: tl.constexpr, BM: tl.constexpr,
    BK: tl.constexpr, DOT_PREC: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """out[p, sl*R + j] = scale[s, sl*R + j] * src[row(p)] @ a[s, e, sl*R + j]^T for j < rank[s], NSL slices;
    NSL = 2 and shared[s]: slice 1 equals slice 0 (one A for gate and up): only slice 0's A is read, stored twice.
    MODE (the constants above): BLOCKS, one (expert, slot) block; BLOCK_SLOTS, a by-expert block's j-th distinct
    adapted slot (in row order) and its rows; GROUPS, group g = e * n_slot + s + 1, its rows the contiguous run
    [end[g] - count[g], end[g]) (by expert: an expert's rows in slot order). Each (expert, adapter) of a block, or
    each group, reads its A once (a group's later tiles from L2). PDL: every CTA waits for the alignment before
    anything, then lets the next launch (the gate_up GEMM, whose main loop needs no shrink output) start."""
    wait_predecessor(PDL)
    launch_dependents(PDL)
    if MODE == 2:  # GROUPS
        g = tl.program_id(0)
        s = g % n_slot - 1
        e = g // n_slot
        if s < 0:
            return
        n = tl.load(gcount_ptr + g)
        if n == 0:
            return
        stop = tl.load(gend_ptr + g)
        start = stop - n
    else:
        if MODE == 1:  # BLOCK_SLOTS
            b = tl.program_id(0) // BM
            j = tl.program_id(0) % BM
        else:
            b = tl.program_id(0)
        e = tl.load(bexp_ptr + b)
        if e < 0:
            return
        pair = tl.load(pair_ptr + b * BM + tl.arange(0, BM))
        ok = pair >= 0
        if MODE == 1:
            s_row = tl.load(slot_ptr + pair // top_k, mask=ok, other=-1)
            live = ok & (s_row >= 0) & (tl.load(rank_ptr + tl.maximum(s_row, 0), mask=ok & (s_row >= 0), other=0) > 0)
            i = tl.arange(0, BM)
            # seen[i, i2]: an earlier row i2 has row i's slot
            seen = (s_row[:, None] == s_row[None, :]) & live[None, :] & (i[None, :] < i[:, None])
            first = live & (tl.sum(seen.to(tl.int32), axis=1) == 0)
            mine = first & (tl.cumsum(first.to(tl.int32), 0) == j + 1)
            if tl.sum(mine.to(tl.int32), 0) == 0:
                return
            s = tl.sum(tl.where(mine, s_row, 0), 0)
            ok = ok & (s_row == s)
        else:
            s = tl.load(bslot_ptr + b)
            if s < 0:
                return
    r = tl.load(rank_ptr + s)
    if r == 0:
        return
    shared = 0
    if NSL == 2:
        shared = tl.load(shared_ptr + s)
    a_base = a_ptr + s.to(tl.int64) * stride_a_slot + e.to(tl.int64) * stride_a_exp
    if MODE == 2:  # the group's rows, BM at a time (its A from L2 after the first tile)
        for lo in range(start, stop, BM):
            rows = lo + tl.arange(0, BM)
            ok = rows < stop
            pair = tl.load(pair_ptr + rows, mask=ok, other=0)
            _shrink_rows(
                src_ptr, a_base, scale_ptr, out_ptr, pair, ok, s, r, shared, top_k, R, KD, stride_src, stride_a_row,
                stride_scale, stride_out, GATHER, NSL, RB, BM, BK, DOT_PREC,
            )  # fmt: skip
    else:
        _shrink_rows(
            src_ptr, a_base, scale_ptr, out_ptr, pair, ok, s, r, shared, top_k, R, KD, stride_src, stride_a_row,
            stride_scale, stride_out, GATHER, NSL, RB, BM, BK, DOT_PREC,
        )  # fmt: skip


@triton.jit
def _lora_expand_kernel(
    in_ptr, sh_ptr, b_ptr, rank_ptr, pair_ptr, bexp_ptr, bslot_ptr, rw_ptr, out_ptr,
    N, R,
    stride_in, stride_sh, stride_b_slot, stride_b_exp, stride_bn, stride_out,
    SILU: tl.constexpr, RB: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """v = in[p, n] (+ sh[p] @ b[s, e, n]^T); SILU: out[p, n] = silu(v) * (in[p, N + n] (+ ...)); else
    out[p, n] = v * rw[p]. Every pair passes (base ones without the LoRA term). One program per block, looping
    over n: the shrink rows are loaded once, and a decode step's ~2,000 mostly empty blocks stay ~2,000 programs."""
    b = tl.program_id(0)
    e = tl.load(bexp_ptr + b)
    if e < 0:
        return
    pair = tl.load(pair_ptr + b * BM + tl.arange(0, BM))
    ok = pair >= 0
    row = pair.to(tl.int64)
    s = tl.load(bslot_ptr + b)
    r = tl.where(s >= 0, tl.load(rank_ptr + tl.maximum(s, 0)), 0)  # 0: base rows or an empty slot
    c = tl.arange(0, RB)  # rank columns 0..r of slice 0 (gate, or down); up's are R..R+r
    c_ok = c < r
    sh_mask = ok[:, None] & c_ok[None, :]
    sh = tl.load(sh_ptr + pair[:, None] * stride_sh + c[None, :], mask=sh_mask, other=0.0)  # [BM, RB]
    if SILU:
        sh_u = tl.load(sh_ptr + pair[:, None] * stride_sh + (R + c)[None, :], mask=sh_mask, other=0.0)
    else:
        rw = tl.load(rw_ptr + pair, mask=ok, other=0.0).to(tl.float32)
    b_base = b_ptr + tl.maximum(s, 0).to(tl.int64) * stride_b_slot + e.to(tl.int64) * stride_b_exp
    for n0 in range(0, N, BN):
        n = n0 + tl.arange(0, BN)
        n_ok = n < N
        mask = ok[:, None] & n_ok[None, :]
        v = tl.load(in_ptr + row[:, None] * stride_in + n[None, :], mask=mask, other=0.0).to(tl.float32)
        if SILU:
            u = tl.load(in_ptr + row[:, None] * stride_in + (n + N)[None, :], mask=mask, other=0.0).to(tl.float32)
        if r > 0:
            b_mask = c_ok[:, None] & n_ok[None, :]
            bt = tl.load(b_base + n[None, :] * stride_bn + c[:, None], mask=b_mask, other=0.0)  # [RB, BN]
            v = tl.dot(sh, bt.to(sh.dtype), v, input_precision=DOT_PREC)
            if SILU:  # up rows of B hold up's rank columns 0..r (kernels/expert_weights.py)
                bt = tl.load(b_base + (n + N)[None, :] * stride_bn + c[:, None], mask=b_mask, other=0.0)
                u = tl.dot(sh_u, bt.to(sh_u.dtype), u, input_precision=DOT_PREC)
        if SILU:
            v = v * tl.sigmoid(v) * u
        else:
            v = v * rw[:, None]
        tl.store(out_ptr + row[:, None] * stride_out + n[None, :], v.to(out_ptr.dtype.element_ty), mask=mask)


def shrink(
    src, a, scale, rank, shared, al: MoeAlign, out, top_k, R, *, gather, nsl, prec, slot=None, pdl: PdlMode = PdlMode()
) -> None:
    """`_lora_shrink_kernel` over the (expert, slot) blocks of `al`, or with `slot` ([T], -1 = base) over an alignment
    by expert (rows of many slots a block): 16-row blocks BLOCK_SLOTS, larger ones GROUPS. a [L, E, nsl*R, KD],
    out [T*K, nsl*R]; shared [L] int32 (read with nsl = 2). pdl.launch: a programmatic dependent launch."""
    # H200, Qwen3-30B-A3B shapes (benchmarks/HISTORY.md, sessions 24-25). Decode-sized steps, BLOCK_SLOTS at 2 warps,
    # BK 128, 4 stages: 256 tokens x 16 / 35 adapters 42 / 51 us (54 / 63 at 4 warps, BK 64, 3 stages); GROUPS there
    # was ~15 us slower. A prefill chunk (8,192 tokens, 64-row blocks): GROUPS ~120 us at 16 adapters, where
    # BLOCK_SLOTS took 612 (a block's 64 programs, most without an adapter of their own, each scanning the block)
    mode = BLOCKS if slot is None else BLOCK_SLOTS if al.block_m <= 16 else GROUPS
    warps, bk, stages = (2, 128, 4) if mode == BLOCK_SLOTS else (4, BK, 3)
    grid = {BLOCKS: al.num_blocks, BLOCK_SLOTS: al.num_blocks * al.block_m, GROUPS: al.group_count.shape[0]}[mode]
    launch(
        _lora_shrink_kernel, (grid,), src, a, scale, rank, shared, al.sorted_pair, al.block_expert, al.block_slot,
        slot if slot is not None else al.block_slot, al.group_end, al.group_count, out, a.shape[3], top_k, R, al.n_slot,
        src.stride(0), a.stride(0), a.stride(1), a.stride(2), scale.stride(0), out.stride(0),
        GATHER=gather, MODE=mode, NSL=nsl, RB=rank_bucket(R), BM=al.block_m, BK=bk, DOT_PREC=prec, PDL=pdl.launch,
        num_warps=warps, num_stages=stages, **pdl.kwargs(),
    )  # fmt: skip


def expand(inp, sh, b, rank, al: MoeAlign, rw, out, n_out, R, *, silu, prec) -> None:
    """`_lora_expand_kernel` over the (expert, slot) blocks: b [L, E, n_out (x2 with silu), R (x2 with silu)]."""
    launch(
        _lora_expand_kernel, (al.num_blocks,), inp, sh, b, rank, al.sorted_pair, al.block_expert,
        al.block_slot, rw, out, n_out, R,
        inp.stride(0), sh.stride(0), b.stride(0), b.stride(1), b.stride(2), out.stride(0),
        SILU=silu, RB=rank_bucket(R), BM=al.block_m, BN=BN, DOT_PREC=prec,
    )  # fmt: skip
