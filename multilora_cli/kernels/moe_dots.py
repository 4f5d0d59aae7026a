"""The expert-LoRA epilogue of `kernels/moe_gemm.py` as tensor-core dots, one per distinct adapter of a block.

A by-expert block holds BM pairs of one expert e and of any adapters. The block walks its distinct adapted slots
in increasing order (`_next_slot`, a min-reduction over the block's rows) and, per slot s, runs one dot over all
BM rows with the rows of other slots zeroed:

    gate_up:   acc   += where(slot == s, sg[:, :r_s])     @ gu_b[s, e, n-tile, :r_s]^T          [BM, BN]
               acc_u += where(slot == s, sg[:, R:R+r_s])  @ gu_b[s, e, I + n-tile, :r_s]^T
    part:      part[tile, p, :r_s] = round(act[p, n-tile]) @ dn_a[s, e, :r_s, n-tile]^T   rows of s only
    sum_parts: sd[p, :r_s] = round(sum over tiles in order of part[tile, p, :r_s] * dn_scale[s, :r_s])  (own launch)
    down:      acc   += where(slot == s, sd[:, :r_s])     @ dn_b[s, e, n-tile, :r_s]^T

Each slot's factor tile ([r_s, BN]) is read once per program, coalesced (a per-row epilogue would gather it once
per row of that slot and multiply with fp32 FMAs: 1.4-4.1x these dots' time on an H200). The products are the
exact products of the inputs (bf16 x bf16 or fp32 x fp32 with ieee dots), summed in fp32. Batch invariance holds:
a row of another slot contributes exact zeros to a row's accumulator (0 x finite = 0, acc + 0 = acc), so a row's
result depends on its own token, expert and slot only. Rank-aware: columns past r_s are masked (no bytes read).

A decode step's block (16 rows, ~10 adapters) runs ~10 dots of [16, R] x [R, BN]. The down shrink's partials are
summed by one small launch (`sum_parts`, [T*K, R]) rather than by each of the down GEMM's H / BN programs of a
block (32 at Qwen3-30B-A3B shapes, each re-reading all I / BN partials): H200, 256 tokens x 16 / 35 adapters, one
layer 494 -> 481 / 526 -> 510 us, 512 tokens 724 -> 683 (the same at 16 and 64 tokens, benchmarks/HISTORY.md).
A prefill-sized step (hundreds of pairs per expert) has few distinct adapters per 64-row block; there the grouped
path (kernels/moe_lora.py) is as fast up to 8,192 pairs and faster beyond (fused_moe.ROW_LORA_MAX_PAIRS).
"""

from __future__ import annotations

import triton
import triton.language as tl

from multilora_cli.kernels.pdl import PdlMode, launch_dependents, wait_predecessor


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
    acc, s, live, pair, e, n, n_ok, sh_ptr, b_ptr, rank_ptr, stride_sh, stride_b_slot, stride_b_exp, stride_bn,
    RB: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """acc [BM, BN] fp32 plus each row's down expand (sh = sd [T*K, R] in x's dtype: the down shrink as
    `sum_parts` left it)."""
    c = tl.arange(0, RB)
    cur = _next_slot(s, live, -1)
    while cur < 1 << 30:
        cm = c < tl.load(rank_ptr + cur)
        rows = (live & (s == cur))[:, None] & cm[None, :]
        sd = tl.load(sh_ptr + pair[:, None] * stride_sh + c[None, :], mask=rows, other=0.0)  # [BM, RB]
        base = b_ptr + cur.to(tl.int64) * stride_b_slot + e.to(tl.int64) * stride_b_exp
        bt = tl.load(base + n[None, :] * stride_bn + c[:, None], mask=cm[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(sd.to(bt.dtype), bt, acc, input_precision=DOT_PREC)
        cur = _next_slot(s, live, cur)
    return acc


@triton.jit
def _sum_parts_kernel(
    part_ptr, scale_ptr, slot_ptr, rank_ptr, out_ptr, P, top_k, n_parts, R, stride_part, stride_scale, stride_out,
    RB: tl.constexpr, BP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """out[p, :r] = round(sum over t in order of part[t, p, :r] * scale[s, :r]), 0 past r (s = slot[p // top_k])."""
    wait_predecessor(PDL)  # part comes from the gate_up GEMM; every CTA waits before it lets the down GEMM start
    launch_dependents(PDL)
    p = tl.program_id(0) * BP + tl.arange(0, BP)
    ok = p < P
    s = tl.load(slot_ptr + p // top_k, mask=ok, other=-1)
    r = tl.load(rank_ptr + tl.maximum(s, 0), mask=ok & (s >= 0), other=0)
    c = tl.arange(0, RB)
    cols = c[None, :] < r[:, None]  # [BP, RB]
    acc = tl.zeros((BP, RB), dtype=tl.float32)
    for t in range(0, n_parts):
        acc += tl.load(part_ptr + t * stride_part + p[:, None] * R + c[None, :], mask=cols, other=0.0)
    s64 = tl.maximum(s, 0).to(tl.int64)
    acc = acc * tl.load(scale_ptr + s64[:, None] * stride_scale + c[None, :], mask=cols, other=0.0)
    out = out_ptr + p[:, None].to(tl.int64) * stride_out + c[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=ok[:, None] & (c[None, :] < R))


def sum_parts(part, scale, slot, rank, out, top_k: int, R: int, pdl: PdlMode = PdlMode()) -> None:
    """`_sum_parts_kernel`: part [n_parts, T*K, R] fp32, scale [L, R] fp32, slot [T], rank [L] -> out [T*K, R]."""
    from multilora_cli.kernels.checks import rank_bucket
    from multilora_cli.kernels.launch import launch

    P, bp = part.shape[1], 64
    launch(
        _sum_parts_kernel, (triton.cdiv(P, bp),), part, scale, slot, rank, out, P, top_k, part.shape[0], R,
        part.stride(0), scale.stride(0), out.stride(0), RB=rank_bucket(R), BP=bp, PDL=pdl.launch, **pdl.kwargs(),
    )  # fmt: skip
