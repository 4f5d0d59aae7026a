"""`fused_moe`: a sparse MoE block's experts with per-token expert LoRA in four Triton launches, CUDA-graph safe.

Semantics: exactly `kernels/moe_reference.moe_reference` (its docstring; it is the torch reference the tests
compare against). Shapes (T tokens, K top-k, E experts, hidden H, expert intermediate I, L slots, R max rank):

    x:       [T, H]          fp16 | bf16 | fp32       weights: [T, K] fp32 or x's dtype (routing weights)
    experts: [T, K]          int (distinct per row)   slot:    [T] int, -1 = base (None: no LoRA)
    gate_up: [E, 2I, H]      x's dtype                down:    [E, H, I] x's dtype
    lora:    ExpertLoraWeights in x's dtype (kernels/expert_weights.py: gate|up A/B, block-diagonal B, scales
             per rank column, rank per slot)

    pairs p = t*K + k sorted by (expert, slot) into block-aligned rows (kernels/moe_align.py; static shapes)
    1. shrink_gu[row] = (x[t] @ gu_a[s, e]^T) * gu_scale[s]           [P_pad, 2R]  (rows of adapted blocks)
    2. h = x[t] @ gate_up[e]^T (+ shrink_gu[row] @ gu_b[s, e]^T)      [BM, 2I] in fp32 registers
       act[row] = silu(h[:I]) * h[I:]                                 [P_pad, I]  x's dtype
    3. shrink_dn[row] = (act[row] @ dn_a[s, e]^T) * dn_scale[s]        [P_pad, R]
    4. y[p] = (act[row] @ down[e]^T (+ shrink_dn[row] @ dn_b[s, e]^T)) * weights[t, k]     [T*K, H]
    out[t] = sum over k = 0..K-1 of y[t*K + k]  (fp32 sum in k order, cast to x's dtype)

Each row's numbers depend on its own token, expert and slot only (the per-token sum runs over its K pairs in a
fixed order, no atomics), so a row's result does not depend on its neighbours. Rank-aware: a slot's rank rows
past `lora.rank[s]` are masked (no bytes read), an empty slot (rank 0) or slot -1 skips the LoRA work. Grids
are static given T (padding blocks exit at once): the whole call can be captured in a CUDA graph.
Differences from the reference: h and y stay in fp32 until act / y are stored (the reference rounds h to x's
dtype before SiLU), so bf16 agrees to bf16 rounding, fp32 to ~1e-6.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.checks import rank_bucket
from multilora_cli.kernels.expert_weights import ExpertLoraWeights
from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.moe_align import align_pairs

BN, BK = 64, 64


@triton.jit
def _moe_shrink_kernel(
    src_ptr, a_ptr, scale_ptr, rank_ptr, pair_ptr, bexp_ptr, bslot_ptr, out_ptr,
    KD, top_k, R,
    stride_src, stride_a_slot, stride_a_exp, stride_a_row, stride_scale, stride_out,
    GATHER: tl.constexpr, NSL: tl.constexpr, RB: tl.constexpr, BM: tl.constexpr, BKS: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    """out[row, sl*R + j] = scale[s, sl*R + j] * src[row'] @ a[s, e, sl*R + j]^T for j < rank[s], NSL slices."""
    b = tl.program_id(0)
    e = tl.load(bexp_ptr + b)
    s = tl.load(bslot_ptr + b)
    if (e < 0) | (s < 0):
        return
    r = tl.load(rank_ptr + s)
    if r == 0:
        return
    rows = b * BM + tl.arange(0, BM)
    pair = tl.load(pair_ptr + rows)
    ok = pair >= 0
    if GATHER:  # x is gathered by token; act is already in sorted rows
        src_row = pair // top_k
    else:
        src_row = rows
    n = tl.arange(0, NSL * RB)
    col = (n // RB) * R + n % RB
    col_ok = n % RB < r
    a_base = a_ptr + s.to(tl.int64) * stride_a_slot + e.to(tl.int64) * stride_a_exp
    acc = tl.zeros((BM, NSL * RB), dtype=tl.float32)
    for k in range(0, KD, BKS):
        kk = k + tl.arange(0, BKS)
        k_ok = kk < KD
        xt = tl.load(src_ptr + src_row[:, None] * stride_src + kk[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
        at = tl.load(
            a_base + col[None, :] * stride_a_row + kk[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0.0
        )
        acc = tl.dot(xt, at.to(xt.dtype), acc, input_precision=DOT_PREC)
    scale = tl.load(scale_ptr + s * stride_scale + col, mask=col_ok, other=0.0)
    acc = acc * scale[None, :]
    out = out_ptr + rows[:, None] * stride_out + col[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=ok[:, None] & col_ok[None, :])


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, pair_ptr, bexp_ptr, bslot_ptr, sh_ptr, b_ptr, rank_ptr, act_ptr,
    H, INTER, top_k, R, n_tiles,
    stride_x, stride_we, stride_wn, stride_sh, stride_b_slot, stride_b_exp, stride_bn, stride_act,
    HAS_LORA: tl.constexpr, RB: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    """act[rows, n-tile] = silu(g) * u, [g | u] = x[tok] @ gate_up[e]^T (+ shrink_gu[rows] @ gu_b[s, e]^T)."""
    pid = tl.program_id(0)
    b = pid // n_tiles  # blocks on the slow axis: padding blocks (static grid) come after the real work
    e = tl.load(bexp_ptr + b)
    if e < 0:
        return
    rows = b * BM + tl.arange(0, BM)
    pair = tl.load(pair_ptr + rows)
    ok = pair >= 0
    tok = pair // top_k
    n = (pid % n_tiles) * BN + tl.arange(0, BN)
    n_ok = n < INTER
    w_base = w_ptr + e.to(tl.int64) * stride_we
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, H, BK):
        kk = k + tl.arange(0, BK)
        k_ok = kk < H
        xt = tl.load(x_ptr + tok[:, None] * stride_x + kk[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = n_ok[None, :] & k_ok[:, None]
        wg = tl.load(w_base + n[None, :] * stride_wn + kk[:, None], mask=w_mask, other=0.0)  # [BK, BN]
        wu = tl.load(w_base + (n + INTER)[None, :] * stride_wn + kk[:, None], mask=w_mask, other=0.0)
        acc_g = tl.dot(xt, wg, acc_g, input_precision=DOT_PREC)
        acc_u = tl.dot(xt, wu, acc_u, input_precision=DOT_PREC)
    if HAS_LORA:
        s = tl.load(bslot_ptr + b)
        if s >= 0:
            r = tl.load(rank_ptr + s)
            if r > 0:
                c = tl.arange(0, 2 * RB)
                col = (c // RB) * R + c % RB  # gate ranks 0..r, up ranks R..R+r
                c_ok = c % RB < r
                sh = tl.load(
                    sh_ptr + rows[:, None] * stride_sh + col[None, :], mask=ok[:, None] & c_ok[None, :], other=0.0
                )
                b_base = b_ptr + s.to(tl.int64) * stride_b_slot + e.to(tl.int64) * stride_b_exp
                b_mask = c_ok[:, None] & n_ok[None, :]
                bg = tl.load(b_base + n[None, :] * stride_bn + col[:, None], mask=b_mask, other=0.0)  # [2RB, BN]
                bu = tl.load(b_base + (n + INTER)[None, :] * stride_bn + col[:, None], mask=b_mask, other=0.0)
                acc_g = tl.dot(sh, bg.to(sh.dtype), acc_g, input_precision=DOT_PREC)
                acc_u = tl.dot(sh, bu.to(sh.dtype), acc_u, input_precision=DOT_PREC)
    act = acc_g * tl.sigmoid(acc_g) * acc_u
    out = act_ptr + rows[:, None] * stride_act + n[None, :]
    tl.store(out, act.to(act_ptr.dtype.element_ty), mask=ok[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(
    act_ptr, w_ptr, pair_ptr, bexp_ptr, bslot_ptr, sh_ptr, b_ptr, rank_ptr, rw_ptr, y_ptr,
    H, INTER, n_tiles,
    stride_act, stride_we, stride_wn, stride_sh, stride_b_slot, stride_b_exp, stride_bn, stride_y,
    HAS_LORA: tl.constexpr, RB: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    """y[pair, n-tile] = (act[rows] @ down[e]^T (+ shrink_dn[rows] @ dn_b[s, e]^T)) * weights[pair]."""
    pid = tl.program_id(0)
    b = pid // n_tiles
    e = tl.load(bexp_ptr + b)
    if e < 0:
        return
    rows = b * BM + tl.arange(0, BM)
    pair = tl.load(pair_ptr + rows)
    ok = pair >= 0
    n = (pid % n_tiles) * BN + tl.arange(0, BN)
    n_ok = n < H
    w_base = w_ptr + e.to(tl.int64) * stride_we
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, INTER, BK):
        kk = k + tl.arange(0, BK)
        k_ok = kk < INTER
        at = tl.load(act_ptr + rows[:, None] * stride_act + kk[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
        wt = tl.load(w_base + n[None, :] * stride_wn + kk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        acc = tl.dot(at, wt, acc, input_precision=DOT_PREC)
    if HAS_LORA:
        s = tl.load(bslot_ptr + b)
        if s >= 0:
            r = tl.load(rank_ptr + s)
            if r > 0:
                j = tl.arange(0, RB)
                j_ok = j < r
                sh = tl.load(
                    sh_ptr + rows[:, None] * stride_sh + j[None, :], mask=ok[:, None] & j_ok[None, :], other=0.0
                )
                b_base = b_ptr + s.to(tl.int64) * stride_b_slot + e.to(tl.int64) * stride_b_exp
                bt = tl.load(
                    b_base + n[None, :] * stride_bn + j[:, None], mask=j_ok[:, None] & n_ok[None, :], other=0.0
                )
                acc = tl.dot(sh, bt.to(sh.dtype), acc, input_precision=DOT_PREC)
    rw = tl.load(rw_ptr + pair, mask=ok, other=0.0).to(tl.float32)
    acc = acc * rw[:, None]
    out = y_ptr + pair[:, None].to(tl.int64) * stride_y + n[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=ok[:, None] & n_ok[None, :])


def block_m_for(num_pairs: int) -> int:
    """Rows per block: 16 (the tensor-core minimum) for decode-sized steps, where most experts get a few pairs;
    64 once there are enough pairs per expert to fill bigger tiles."""
    return 16 if num_pairs <= 4096 else 64


def fused_moe(
    x: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    slot: torch.Tensor | None = None,
    lora: ExpertLoraWeights | None = None,
    block_m: int | None = None,
) -> torch.Tensor:
    """See the module docstring. Returns out [T, H] in x's dtype."""
    T, K = experts.shape
    E, two_i, H = gate_up.shape
    inter = two_i // 2
    if T == 0:
        return torch.zeros_like(x)
    x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
    use_lora = lora is not None and slot is not None
    bm = block_m or block_m_for(T * K)
    al = align_pairs(experts, slot if use_lora else None, E, lora.max_loras if use_lora else 0, bm)
    nb, rows = al.num_blocks, al.sorted_pair.shape[0]
    meta = (al.sorted_pair, al.block_expert, al.block_slot)
    prec = "ieee" if x.dtype == torch.float32 else "tf32"  # fp32: exact products, not tf32's (as sgmv_*)
    if use_lora:
        R = lora.max_rank
        rb = rank_bucket(R)
        sh_gu = torch.empty(rows, 2 * R, dtype=x.dtype, device=x.device)
        _shrink(x, lora.gu_a, lora.gu_scale, lora.rank, meta, sh_gu, K, R, True, 2, rb, bm, prec)
        gu_b, dn_b, rank = lora.gu_b, lora.dn_b, lora.rank
    else:
        R, rb = 0, 16
        sh_gu = gu_b = dn_b = x  # never read (HAS_LORA off)
        rank = al.block_slot
    act = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(inter, BN)
    launch(
        _gate_up_kernel, (nb * tiles,), x, gate_up, *meta, sh_gu, gu_b, rank, act,
        H, inter, K, R, tiles,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), sh_gu.stride(0),
        gu_b.stride(0), gu_b.stride(1) if use_lora else 0, gu_b.stride(2) if use_lora else 0, act.stride(0),
        HAS_LORA=use_lora, RB=rb, BM=bm, BN=BN, BK=BK, DOT_PREC=prec,
    )  # fmt: skip
    if use_lora:
        sh_dn = torch.empty(rows, R, dtype=x.dtype, device=x.device)
        _shrink(act, lora.dn_a, lora.dn_scale, lora.rank, meta, sh_dn, K, R, False, 1, rb, bm, prec)
    else:
        sh_dn = x
    y = torch.empty(T * K, H, dtype=x.dtype, device=x.device)  # every pair's row is written once
    tiles = triton.cdiv(H, BN)
    launch(
        _down_kernel, (nb * tiles,), act, down, *meta, sh_dn, dn_b, rank, weights.contiguous().view(-1), y,
        H, inter, tiles,
        act.stride(0), down.stride(0), down.stride(1), sh_dn.stride(0),
        dn_b.stride(0), dn_b.stride(1) if use_lora else 0, dn_b.stride(2) if use_lora else 0, y.stride(0),
        HAS_LORA=use_lora, RB=rb, BM=bm, BN=BN, BK=BK, DOT_PREC=prec,
    )  # fmt: skip
    return y.view(T, K, H).sum(dim=1, dtype=torch.float32).to(x.dtype)


def _shrink(src, a, scale, rank, meta, out, top_k, R, gather, nsl, rb, bm, prec) -> None:
    """One shrink launch over the blocks (kernel `_moe_shrink_kernel`): a [L, E, NSL*R, KD], out [P_pad, NSL*R]."""
    launch(
        _moe_shrink_kernel, (meta[1].shape[0],), src, a, scale, rank, *meta, out,
        a.shape[3], top_k, R,
        src.stride(0), a.stride(0), a.stride(1), a.stride(2), scale.stride(0), out.stride(0),
        GATHER=gather, NSL=nsl, RB=rb, BM=bm, BKS=BK, DOT_PREC=prec,
    )  # fmt: skip
