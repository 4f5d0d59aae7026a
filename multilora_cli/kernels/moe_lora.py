"""Expert-LoRA kernels grouped by (expert, adapter slot) (kernels/moe_align.py's `by (expert, slot)` order): the
shrink of every step, and the expand of steps too large for `kernels/moe_gemm.py`'s per-row expand.

    _shrink: out[p, sl*R + j] = scale[s, sl*R + j] * src[row(p)] @ a[s, e, sl*R + j]^T     j < rank[s], NSL slices
             src [T or T*K, KD], a [L, E, NSL*R, KD], scale [L, NSL*R] fp32, out [T*K, NSL*R] in src's dtype
    _expand: v = in[p, n] + sh[p] @ b[s, e, n]^T (the LoRA term only for s >= 0 and rank[s] > 0);
             SILU: out[p, n] = silu(v) * (in[p, N + n] + sh[p, R:] @ b[s, e, N + n, :]^T),  out [T*K, N]
             else: out[p, n] = v * rw[p]                                                     out [T*K, N]

One program per (expert, slot) block: the block's rows share one adapter's factors of one expert, so they are read
once per block with tensor-core dots. Torch reference: kernels/moe_reference.py (the tests go through fused_moe).
"""

from __future__ import annotations

import triton
import triton.language as tl

from multilora_cli.kernels.checks import rank_bucket
from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.moe_align import MoeAlign

BN, BK = 64, 64


@triton.jit
def _lora_shrink_kernel(
    src_ptr, a_ptr, scale_ptr, rank_ptr, shared_ptr, pair_ptr, bexp_ptr, bslot_ptr, slot_ptr, out_ptr,
    KD, top_k, R,
    stride_src, stride_a_slot, stride_a_exp, stride_a_row, stride_scale, stride_out,
    GATHER: tl.constexpr, BY_EXPERT: tl.constexpr, NSL: tl.constexpr, RB: tl.constexpr, BM: tl.constexpr,
    BK: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """out[p, sl*R + j] = scale[s, sl*R + j] * src[row(p)] @ a[s, e, sl*R + j]^T for j < rank[s], NSL slices;
    NSL = 2 and shared[s]: slice 1 equals slice 0 (one A for gate and up): only slice 0's A is read, stored twice.
    BY_EXPERT: the blocks are by expert alone, rows of many slots; program (b, j) takes the block's j-th distinct
    adapted slot (in row order) and its rows: each (expert, adapter) of a block reads its A once."""
    if BY_EXPERT:
        b = tl.program_id(0) // BM
        j = tl.program_id(0) % BM
    else:
        b = tl.program_id(0)
    e = tl.load(bexp_ptr + b)
    if e < 0:
        return
    pair = tl.load(pair_ptr + b * BM + tl.arange(0, BM))
    ok = pair >= 0
    if BY_EXPERT:
        s_row = tl.load(slot_ptr + pair // top_k, mask=ok, other=-1)
        live = ok & (s_row >= 0) & (tl.load(rank_ptr + tl.maximum(s_row, 0), mask=ok & (s_row >= 0), other=0) > 0)
        i = tl.arange(0, BM)
        seen = (s_row[:, None] == s_row[None, :]) & live[None, :] & (i[None, :] < i[:, None])  # an earlier row has it
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
    if GATHER:
        src_row = pair // top_k
    else:
        src_row = pair
    c = tl.arange(0, NSL * RB)
    col = (c // RB) * R + c % RB
    col_ok = c % RB < r
    read = col_ok  # the A rows read
    if NSL == 2:
        shared = tl.load(shared_ptr + s)
        read = col_ok & (c < tl.where(shared != 0, RB, 2 * RB))  # shared: slice 0's rows only
    a_base = a_ptr + s.to(tl.int64) * stride_a_slot + e.to(tl.int64) * stride_a_exp
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


def shrink(src, a, scale, rank, shared, al: MoeAlign, out, top_k, R, *, gather, nsl, prec, slot=None) -> None:
    """`_lora_shrink_kernel` over the (expert, slot) blocks, or with `slot` ([T], -1 = base) over blocks by expert
    alone (BM programs a block, one per distinct slot): a [L, E, nsl*R, KD], out [T*K, nsl*R]; shared [L] int32
    (read with nsl = 2)."""
    by_expert = slot is not None
    # by expert (decode steps: a program's rows are the one or two of its adapter in a block, [<=16, 2R] tiles):
    # 2 warps, BK 128, 4 stages. H200, Qwen3-30B-A3B shapes, 256 tokens x 16 / 35 adapters: 54 / 63 us at the
    # default 4 warps, BK 64, 3 stages -> 42 / 51 us; 64 tokens 31 -> 24; 512 tokens 85 / 101 -> 68 / 81
    warps, bk, stages = (2, 128, 4) if by_expert else (4, BK, 3)
    launch(
        _lora_shrink_kernel, (al.num_blocks * (al.block_m if by_expert else 1),), src, a, scale, rank, shared,
        al.sorted_pair, al.block_expert, al.block_slot, slot if by_expert else al.block_slot, out, a.shape[3], top_k, R,
        src.stride(0), a.stride(0), a.stride(1), a.stride(2), scale.stride(0), out.stride(0),
        GATHER=gather, BY_EXPERT=by_expert, NSL=nsl, RB=rank_bucket(R), BM=al.block_m, BK=bk, DOT_PREC=prec,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip


def expand(inp, sh, b, rank, al: MoeAlign, rw, out, n_out, R, *, silu, prec) -> None:
    """`_lora_expand_kernel` over the (expert, slot) blocks: b [L, E, n_out (x2 with silu), R (x2 with silu)]."""
    launch(
        _lora_expand_kernel, (al.num_blocks,), inp, sh, b, rank, al.sorted_pair, al.block_expert,
        al.block_slot, rw, out, n_out, R,
        inp.stride(0), sh.stride(0), b.stride(0), b.stride(1), b.stride(2), out.stride(0),
        SILU=silu, RB=rank_bucket(R), BM=al.block_m, BN=BN, DOT_PREC=prec,
    )  # fmt: skip
