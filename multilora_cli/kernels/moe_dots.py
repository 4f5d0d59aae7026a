"""The expert-LoRA epilogue of `kernels/moe_gemm.py` as tensor-core dots, one per distinct adapter of a block.

A by-expert block holds BM pairs of one expert e and of any adapters. The block walks its distinct adapted slots
in increasing order (`_next_slot`, a min-reduction over the block's rows) and, per slot s, runs one dot over all
BM rows with the rows of other slots zeroed:

    gate_up:   acc   += where(slot == s, sg[:, :r_s])     @ gu_b[s, e, n-tile, :r_s]^T          [BM, BN]
               acc_u += where(slot == s, sg[:, R:R+r_s])  @ gu_b[s, e, I + n-tile, :r_s]^T
    part:      part[tile, p, :r_s] = round(act[p, n-tile]) @ dn_a[s, e, :r_s, n-tile]^T   rows of s only
    down:      acc   += where(slot == s, sd[:, :r_s])     @ dn_b[s, e, n-tile, :r_s]^T

Each slot's factor tile ([r_s, BN]) is read once per program, coalesced (a per-row epilogue would gather it once
per row of that slot and multiply with fp32 FMAs: 1.4-4.1x these dots' time on an H200). The products are the
exact products of the inputs (bf16 x bf16 or fp32 x fp32 with ieee dots), summed in fp32. Batch invariance holds:
a row of another slot contributes exact zeros to a row's accumulator (0 x finite = 0, acc + 0 = acc), so a row's
result depends on its own token, expert and slot only. Rank-aware: columns past r_s are masked (no bytes read).

A decode step's block (16 rows, ~10 adapters) runs ~10 dots of [16, R] x [R, BN]. A prefill-sized step (hundreds
of pairs per expert) has few distinct adapters per 64-row block; there the grouped path (kernels/moe_lora.py) is
as fast up to 8,192 pairs and faster beyond (fused_moe.ROW_LORA_MAX_PAIRS).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _next_slot(s, live, after):
    """The smallest slot above `after` among the block's adapted rows (`live`); 1 << 30 once none is left."""
    return tl.min(tl.where(live & (s > after), s, 1 << 30), 0)


@triton.jit
def gate_up_dots(
    acc, acc_u, s, live, pair, e, n, n_ok, sh_ptr, b_ptr, rank_ptr,
    stride_sh, stride_b_slot, stride_b_exp, stride_bn, R, INTER,
    RB: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """acc / acc_u [BM, BN] fp32 plus each row's gate / up expand (sg = sh [T*K, 2R]: gate ranks 0..r, up R..R+r;
    b = gu_b [L, E, 2I, R]: gate rows then up rows)."""
    c = tl.arange(0, RB)
    cur = _next_slot(s, live, -1)
    while cur < 1 << 30:
        cm = c < tl.load(rank_ptr + cur)
        rows = (live & (s == cur))[:, None] & cm[None, :]
        sg = tl.load(sh_ptr + pair[:, None] * stride_sh + c[None, :], mask=rows, other=0.0)  # [BM, RB]
        su = tl.load(sh_ptr + pair[:, None] * stride_sh + (R + c)[None, :], mask=rows, other=0.0)
        base = b_ptr + cur.to(tl.int64) * stride_b_slot + e.to(tl.int64) * stride_b_exp
        bmask = cm[:, None] & n_ok[None, :]
        bg = tl.load(base + n[None, :] * stride_bn + c[:, None], mask=bmask, other=0.0)  # [RB, BN]
        bu = tl.load(base + (n + INTER)[None, :] * stride_bn + c[:, None], mask=bmask, other=0.0)
        acc = tl.dot(sg.to(bg.dtype), bg, acc, input_precision=DOT_PREC)
        acc_u = tl.dot(su.to(bu.dtype), bu, acc_u, input_precision=DOT_PREC)
        cur = _next_slot(s, live, cur)
    return acc, acc_u


@triton.jit
def part_dots(
    act, s, live, r, pair, e, n, n_ok, tile, a2_ptr, rank_ptr, part_ptr,
    stride_a2_slot, stride_a2_exp, stride_a2_row, stride_part, R,
    RB: tl.constexpr, BM: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """Stores part[tile, p, :r] = act[p, n-tile] @ dn_a[s, e, :r, n-tile]^T for the block's adapted rows (act
    [BM, BN] in the output dtype, as stored; dn_a [L, E, R, I]: rows contiguous over I)."""
    c = tl.arange(0, RB)
    part = tl.zeros((BM, RB), dtype=tl.float32)
    cur = _next_slot(s, live, -1)
    while cur < 1 << 30:
        cm = c < tl.load(rank_ptr + cur)
        base = a2_ptr + cur.to(tl.int64) * stride_a2_slot + e.to(tl.int64) * stride_a2_exp
        at = tl.load(base + c[None, :] * stride_a2_row + n[:, None], mask=cm[None, :] & n_ok[:, None], other=0.0)
        got = tl.dot(act, at.to(act.dtype), input_precision=DOT_PREC)  # [BM, RB]: only rows of `cur` are kept
        part = tl.where((live & (s == cur))[:, None], got, part)
        cur = _next_slot(s, live, cur)
    keep = live[:, None] & (c[None, :] < r[:, None])
    tl.store(part_ptr + tile * stride_part + pair[:, None] * R + c[None, :], part, mask=keep)


@triton.jit
def down_dots(
    acc, s, live, r, pair, e, n, n_ok, n_parts, sh_ptr, b_ptr, rank_ptr, part_ptr,
    stride_sh, stride_b_slot, stride_b_exp, stride_bn, stride_part, R,
    RB: tl.constexpr, NPB: tl.constexpr, TP: tl.constexpr, BM: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """acc [BM, BN] fp32 plus each row's down expand: sd = round(sum over tiles of part[., p, :r] * dn_scale[s, :r])
    (sh = dn_scale [L, R] fp32; TP tiles' partials per load, summed in a fixed order), then the slot dots."""
    c = tl.arange(0, RB)
    cols = live[:, None] & (c[None, :] < r[:, None])  # [BM, RB]
    sd = tl.zeros((BM, RB), dtype=tl.float32)
    for t0 in tl.static_range(0, NPB, TP):
        t = t0 + tl.arange(0, TP)
        pp = part_ptr + t[:, None, None] * stride_part + pair[None, :, None] * R + c[None, None, :]
        sd += tl.sum(tl.load(pp, mask=(t < n_parts)[:, None, None] & cols[None, :, :], other=0.0), axis=0)
    s64 = tl.maximum(s, 0).to(tl.int64)
    sd = sd * tl.load(sh_ptr + s64[:, None] * stride_sh + c[None, :], mask=cols, other=0.0)
    cur = _next_slot(s, live, -1)
    while cur < 1 << 30:
        cm = c < tl.load(rank_ptr + cur)
        base = b_ptr + cur.to(tl.int64) * stride_b_slot + e.to(tl.int64) * stride_b_exp
        bt = tl.load(base + n[None, :] * stride_bn + c[:, None], mask=cm[:, None] & n_ok[None, :], other=0.0)
        mine = tl.where((live & (s == cur))[:, None], sd, 0.0).to(bt.dtype)  # rounded as the reference rounds sd
        acc = tl.dot(mine, bt, acc, input_precision=DOT_PREC)
        cur = _next_slot(s, live, cur)
    return acc


def tiles_per_load(block_m: int, rank_block: int, parts_block: int) -> int:
    """TP: how many tiles' partials `down_dots` loads at once ([TP, BM, RB] fp32 within 2,048 values: 16 a thread
    at 4 warps), a power of two dividing NPB."""
    return max(1, min(parts_block, 2048 // (block_m * rank_block)))
