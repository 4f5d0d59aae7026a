"""`expert_gemm`: the experts' grouped GEMMs of `fused_moe` over the by-expert blocks (kernels/moe_align.py), with an
optional expert-LoRA epilogue (the expand added before the SiLU-and-mul / before the routing weight).

    pair p = t*K + k of expert e = block_expert[b], s = slot[t], r = rank[s] (0 for s = -1 or an empty slot)
    gate_up (silu=True):  src = x [T, H], w = gate_up [E, 2I, H], out = act [T*K, I] in x's dtype
        g = x[t] @ w[e, n]^T (+ sg[p, :r] @ gu_b[s, e, n, :r]^T)          sg [T*K, 2R] (the grouped shrink's output)
        u = x[t] @ w[e, I + n]^T (+ sg[p, R:R+r] @ gu_b[s, e, I + n, :r]^T)
        act[p, n] = silu(g) * u
        lora: part[tile(n), p, :r] = round(act[p, n in tile]) @ dn_a[s, e, :r, n in tile]^T   fp32 [n_tiles, T*K, R]
    down (silu=False):    src = act, w = down [E, H, I], out = y [T*K, H] in x's dtype
        sd = round(sum over tiles of part[., p, :r] * dn_scale[s, :r])  [T*K, R] (the down shrink, in x's dtype;
             moe_dots.sum_parts, its own launch; in a fixed order: a row's sum depends on its own partials only)
        y[p, n] = (act[p] @ w[e, n]^T (+ sd @ dn_b[s, e, n, :r]^T)) * (weight: rw[p])

Why in the epilogue: a block holds one expert's pairs of many adapters (a decode step of 256 tokens and 16 adapters
has ~1,300 (expert, adapter) groups of ~1.6 pairs; grouping the base GEMM by them would stream each expert's
weights once per group). So the block adds its rows' LoRA terms to its own output tile: one tensor-core dot per
distinct adapter of the block, over the block's rows with the other adapters' rows zeroed (kernels/moe_dots.py;
rank-aware, a block without LoRA rows skips it). Each adapter's factor tile is read once per program. What that
removes from the grouped path (kernels/moe_lora.py): the gate_up GEMM's [T*K, 2I] output written and read back, the
expand launches, the down shrink launch, and y's read-modify-write. The down shrink's sum over I is split by the
gate_up GEMM's output tiles (each program owns one tile of act) into fp32 partials that one small launch sums in
a fixed order: no atomics, each row's numbers depend on its own inputs only (batch invariance).
Per-row fp32 FMAs (each row gathering its own adapter's factors, [BM, RC, BN] at a time) were the first epilogue:
at Qwen3-30B-A3B shapes on an H200 they cost 1.4-4.1x the dots' extra time at every step size from 1 to 8,192
tokens (benchmarks/HISTORY.md), and at 16 rows they spilled in gate_up (255 registers) and cut the down GEMM to 2
programs an SM.
Reference: kernels/moe_reference.py; tests compare `fused_moe` with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.checks import rank_bucket
from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.moe_align import MoeAlign
from multilora_cli.kernels.moe_dots import down_dots, gate_up_dots, part_dots
from multilora_cli.kernels.pdl import PdlMode, launch_dependents, wait_predecessor

BN, BK = 64, 64


@dataclass(slots=True)
class RowLora:
    """The LoRA epilogue's operands. gate_up: sh = sg [T*K, 2R], b = gu_b, a2 = dn_a, part written;
    down: sh = sd [T*K, R] (moe_dots.sum_parts of part), b = dn_b, a2 and part None."""

    slot: torch.Tensor  # [T] int, -1 = base
    rank: torch.Tensor  # [L] int32
    sh: torch.Tensor
    b: torch.Tensor
    a2: torch.Tensor | None
    part: torch.Tensor | None  # [n_parts, T*K, R] float32
    max_rank: int  # R


@triton.jit
def _expert_gemm_kernel(
    src_ptr, w_ptr, pair_ptr, bexp_ptr, rw_ptr, out_ptr,
    slot_ptr, rank_ptr, sh_ptr, b_ptr, a2_ptr, part_ptr,
    KD, N, INTER, top_k, n_tiles, R,
    stride_src, stride_we, stride_wn, stride_out,
    stride_sh, stride_b_slot, stride_b_exp, stride_bn, stride_a2_slot, stride_a2_exp, stride_a2_row, stride_part,
    GATHER: tl.constexpr, SILU: tl.constexpr, WEIGHT: tl.constexpr, LORA: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT_PREC: tl.constexpr, RB: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """out[p, n-tile] = src[row(p)] @ w[e, n-tile]^T; SILU: silu(that) * (src @ w[e, INTER + n-tile]^T);
    WEIGHT: times rw[p]. row(p) = p // top_k (GATHER: x by token) or p (act by pair). LORA: the module docstring.
    PDL (LORA only): the main loop runs while the predecessor (the shrink, or sum_parts) still runs; the wait
    comes before the epilogue reads sh, and nothing is written before it."""
    pid = tl.program_id(0)
    b = pid // n_tiles  # blocks on the slow axis: padding blocks (static grid) come after the real work
    tile = pid % n_tiles
    e = tl.load(bexp_ptr + b)
    if e < 0:
        if pid == 0:
            wait_predecessor(PDL)  # the grid's first CTA always waits (see pdl.py)
        return
    pair = tl.load(pair_ptr + b * BM + tl.arange(0, BM))
    ok = pair >= 0
    if GATHER:
        src_row = pair // top_k
    else:
        src_row = pair
    n = tile * BN + tl.arange(0, BN)
    n_ok = n < N
    w_base = w_ptr + e.to(tl.int64) * stride_we
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, KD, BK):
        kk = k + tl.arange(0, BK)
        k_ok = kk < KD
        xt = tl.load(src_ptr + src_row[:, None] * stride_src + kk[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = n_ok[None, :] & k_ok[:, None]
        wt = tl.load(w_base + n[None, :] * stride_wn + kk[:, None], mask=w_mask, other=0.0)  # [BK, BN]
        acc = tl.dot(xt, wt, acc, input_precision=DOT_PREC)
        if SILU:
            wu = tl.load(w_base + (n + INTER)[None, :] * stride_wn + kk[:, None], mask=w_mask, other=0.0)
            acc_u = tl.dot(xt, wu, acc_u, input_precision=DOT_PREC)
    if LORA:
        # the predecessor wrote sh (gate_up: sg by the shrink; down: sd by sum_parts); everything read above was
        # written two or more grids back, which the predecessor's own wait (before it let this grid start) covers
        wait_predecessor(PDL)
        launch_dependents(PDL)
        s = tl.load(slot_ptr + pair // top_k, mask=ok, other=-1)
        r = tl.load(rank_ptr + tl.maximum(s, 0), mask=ok & (s >= 0), other=0)  # [BM]; 0: base row or empty slot
        live = r > 0
        if SILU:
            acc, acc_u = gate_up_dots(
                acc, acc_u, s, live, pair, e, n, n_ok, sh_ptr, b_ptr, rank_ptr,
                stride_sh, stride_b_slot, stride_b_exp, stride_bn, R, INTER, RB, DOT_PREC,
            )  # fmt: skip
        else:
            acc = down_dots(
                acc, s, live, pair, e, n, n_ok, sh_ptr, b_ptr, rank_ptr, stride_sh, stride_b_slot, stride_b_exp,
                stride_bn, RB, DOT_PREC,
            )  # fmt: skip
    if SILU:
        acc = acc * tl.sigmoid(acc) * acc_u
        if LORA:  # the down shrink's partial over this tile's columns of act (as stored: rounded)
            act = acc.to(out_ptr.dtype.element_ty)
            part_dots(
                act, s, live, r, pair, e, n, n_ok, tile, a2_ptr, rank_ptr, part_ptr,
                stride_a2_slot, stride_a2_exp, stride_a2_row, stride_part, R, RB, BM, DOT_PREC,
            )  # fmt: skip
    if WEIGHT:
        acc = acc * tl.load(rw_ptr + pair, mask=ok, other=0.0).to(tl.float32)[:, None]
    out = out_ptr + pair[:, None].to(tl.int64) * stride_out + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=ok[:, None] & n_ok[None, :])


def expert_gemm(
    src, w, al: MoeAlign, rw, out, top_k, n_out, inter, *, gather, silu, weight, prec, lora: RowLora | None = None,
    pdl: PdlMode = PdlMode(), bn: int = BN,
) -> None:  # fmt: skip
    """`_expert_gemm_kernel` over the expert-sorted blocks: w [E, n_out (x2 with silu), KD], out [T*K, n_out].
    pdl.launch (with lora only): launched as a programmatic dependent of the previous launch (kernels/pdl.py)."""
    if pdl.launch and lora is None:
        raise ValueError(
            "expert_gemm: PDL needs the LoRA epilogue (the base GEMM reads its predecessor's output first)"
        )
    tiles = triton.cdiv(n_out, bn)
    if lora is None:
        d = rw  # never read (LORA=False prunes the epilogue)
        lo = (d, d, d, d, d, d, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    else:
        a2 = lora.a2 if lora.a2 is not None else lora.b
        part = lora.part if lora.part is not None else lora.b  # down: never read
        lo = (
            lora.slot, lora.rank, lora.sh, lora.b, a2, part, lora.max_rank,
            lora.sh.stride(0), lora.b.stride(0), lora.b.stride(1), lora.b.stride(2),
            a2.stride(0), a2.stride(1), a2.stride(2), part.stride(0),
        )  # fmt: skip
    launch(
        _expert_gemm_kernel, (al.num_blocks * tiles,), src, w, al.sorted_pair, al.block_expert, rw, out, *lo[:6],
        w.shape[2], n_out, inter, top_k, tiles, lo[6],
        src.stride(0), w.stride(0), w.stride(1), out.stride(0), *lo[7:],
        GATHER=gather, SILU=silu, WEIGHT=weight, LORA=lora is not None,
        BM=al.block_m, BN=bn, BK=BK, DOT_PREC=prec, RB=rank_bucket(max(1, lo[6])), PDL=pdl.launch, **pdl.kwargs(),
    )  # fmt: skip
