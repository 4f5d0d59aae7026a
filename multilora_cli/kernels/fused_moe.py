"""`fused_moe`: a sparse MoE block's experts with per-token expert LoRA in Triton launches, CUDA-graph safe.

Semantics: exactly `kernels/moe_reference.moe_reference` (its docstring; it is the torch reference the tests
compare against). Shapes (T tokens, K top-k, E experts, hidden H, expert intermediate I, L slots, R max rank):

    x:       [T, H]          fp16 | bf16 | fp32       weights: [T, K] fp32 or x's dtype (routing weights)
    experts: [T, K]          int (distinct per row)   slot:    [T] int, -1 = base (None: no LoRA)
    gate_up: [E, 2I, H]      x's dtype                down:    [E, H, I] x's dtype
    lora:    ExpertLoraWeights in x's dtype (kernels/expert_weights.py: gate|up A/B, block-diagonal B, scales
             per rank column, rank per slot)

    pairs p = t*K + k; two block-aligned orders (kernels/moe_align.py, static shapes, no host sync):
      by expert (the base GEMMs: each expert's weights streamed once per block of up to BM pairs),
      by (expert, slot) (the LoRA launches: one adapter's factors of one expert per block)
    base only:
      act[p] = silu(g) * u,  [g | u] = x[t] @ gate_up[e]^T                          [T*K, I]   (one launch)
      y[p]   = (act[p] @ down[e]^T) * weights[t, k]                                 [T*K, H]   (one launch)
    with LoRA (s = slot[t]; the LoRA terms only where s >= 0 and the slot is not empty):
      h[p]   = x[t] @ gate_up[e]^T                                                  [T*K, 2I]  x's dtype
      sg[p]  = (x[t] @ gu_a[s, e]^T) * gu_scale[s]                                  [T*K, 2R]
      act[p] = silu(g) * u,  [g | u] = h[p] + sg[p] @ gu_b[s, e]^T
      yb[p]  = act[p] @ down[e]^T;  sd[p] = (act[p] @ dn_a[s, e]^T) * dn_scale[s]   [T*K, H], [T*K, R]
      y[p]   = (yb[p] + sd[p] @ dn_b[s, e]^T) * weights[t, k]
    out[t] = sum over k = 0..K-1 of y[t*K + k]  (fp32 sum in k order, cast to x's dtype)

Why LoRA goes in launches of its own: a decode step of 256 tokens and 64 adapters has ~2,000 (expert, adapter)
groups of one pair each; grouping the base GEMM by them would stream each expert's weights once per group, by
expert alone once per 16 pairs. Each row's numbers depend on its own token, expert and slot only (the per-token
sum runs over its K pairs in a fixed order; the alignment's atomics only pick which tile row a pair sits in), so a
row's result does not depend on its neighbours (the interpreter test checks it bit for bit).
Rank-aware: a slot's rank rows past `lora.rank[s]` are masked (no bytes read), an empty slot or slot -1 skips the
LoRA terms. Grids are static given T (padding blocks exit at once): the whole call can be captured in a graph.
Accumulation is fp32 in registers; act, h, yb and y are stored in x's dtype (where the reference rounds too).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.checks import rank_bucket
from multilora_cli.kernels.expert_weights import ExpertLoraWeights
from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.moe_align import MoeAlign, align_pairs

BN, BK = 64, 64


@triton.jit
def _expert_gemm_kernel(
    src_ptr, w_ptr, pair_ptr, bexp_ptr, rw_ptr, out_ptr,
    KD, N, INTER, top_k, n_tiles,
    stride_src, stride_we, stride_wn, stride_out,
    GATHER: tl.constexpr, SILU: tl.constexpr, WEIGHT: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """out[p, n-tile] = src[row(p)] @ w[e, n-tile]^T; SILU: silu(that) * (src @ w[e, INTER + n-tile]^T);
    WEIGHT: times rw[p]. row(p) = p // top_k (GATHER: x by token) or p (act by pair)."""
    pid = tl.program_id(0)
    b = pid // n_tiles  # blocks on the slow axis: padding blocks (static grid) come after the real work
    e = tl.load(bexp_ptr + b)
    if e < 0:
        return
    pair = tl.load(pair_ptr + b * BM + tl.arange(0, BM))
    ok = pair >= 0
    if GATHER:
        src_row = pair // top_k
    else:
        src_row = pair
    n = (pid % n_tiles) * BN + tl.arange(0, BN)
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
    if SILU:
        acc = acc * tl.sigmoid(acc) * acc_u
    if WEIGHT:
        acc = acc * tl.load(rw_ptr + pair, mask=ok, other=0.0).to(tl.float32)[:, None]
    out = out_ptr + pair[:, None].to(tl.int64) * stride_out + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=ok[:, None] & n_ok[None, :])


@triton.jit
def _lora_shrink_kernel(
    src_ptr, a_ptr, scale_ptr, rank_ptr, pair_ptr, bexp_ptr, bslot_ptr, out_ptr,
    KD, top_k, R,
    stride_src, stride_a_slot, stride_a_exp, stride_a_row, stride_scale, stride_out,
    GATHER: tl.constexpr, NSL: tl.constexpr, RB: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
    DOT_PREC: tl.constexpr,
):  # fmt: skip
    """out[p, sl*R + j] = scale[s, sl*R + j] * src[row(p)] @ a[s, e, sl*R + j]^T for j < rank[s], NSL slices."""
    b = tl.program_id(0)
    e = tl.load(bexp_ptr + b)
    s = tl.load(bslot_ptr + b)
    if (e < 0) | (s < 0):
        return
    r = tl.load(rank_ptr + s)
    if r == 0:
        return
    pair = tl.load(pair_ptr + b * BM + tl.arange(0, BM))
    ok = pair >= 0
    if GATHER:
        src_row = pair // top_k
    else:
        src_row = pair
    c = tl.arange(0, NSL * RB)
    col = (c // RB) * R + c % RB
    col_ok = c % RB < r
    a_base = a_ptr + s.to(tl.int64) * stride_a_slot + e.to(tl.int64) * stride_a_exp
    acc = tl.zeros((BM, NSL * RB), dtype=tl.float32)
    for k in range(0, KD, BK):
        kk = k + tl.arange(0, BK)
        k_ok = kk < KD
        xt = tl.load(src_ptr + src_row[:, None] * stride_src + kk[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
        at = tl.load(
            a_base + col[None, :] * stride_a_row + kk[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0.0
        )
        acc = tl.dot(xt, at.to(xt.dtype), acc, input_precision=DOT_PREC)
    acc = acc * tl.load(scale_ptr + s * stride_scale + col, mask=col_ok, other=0.0)[None, :]
    out = out_ptr + pair[:, None] * stride_out + col[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=ok[:, None] & col_ok[None, :])


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
            if SILU:  # B is block-diagonal: up rows read only up's rank columns (no zero bytes)
                bt = tl.load(b_base + (n + N)[None, :] * stride_bn + (R + c)[:, None], mask=b_mask, other=0.0)
                u = tl.dot(sh_u, bt.to(sh_u.dtype), u, input_precision=DOT_PREC)
        if SILU:
            v = v * tl.sigmoid(v) * u
        else:
            v = v * rw[:, None]
        tl.store(out_ptr + row[:, None] * stride_out + n[None, :], v.to(out_ptr.dtype.element_ty), mask=mask)


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
    rw = weights.contiguous().view(-1)  # [T*K]
    P, bm = T * K, block_m or block_m_for(T * K)
    prec = "ieee" if x.dtype == torch.float32 else "tf32"  # fp32: exact products, not tf32's (as sgmv_*)
    new = lambda *shape: torch.empty(*shape, dtype=x.dtype, device=x.device)  # noqa: E731
    by_e = align_pairs(experts, None, E, 0, bm)
    if lora is None or slot is None:
        act = new(P, inter)
        _gemm(x, gate_up, by_e, rw, act, K, inter, inter, gather=True, silu=True, weight=False, prec=prec)
        y = new(P, H)
        _gemm(act, down, by_e, rw, y, K, H, inter, gather=False, silu=False, weight=True, prec=prec)
        return y.view(T, K, H).sum(dim=1, dtype=torch.float32).to(x.dtype)
    by_es = align_pairs(experts, slot, E, lora.max_loras, bm)
    R = lora.max_rank
    h = new(P, two_i)
    _gemm(x, gate_up, by_e, rw, h, K, two_i, inter, gather=True, silu=False, weight=False, prec=prec)
    sg = new(P, 2 * R)
    _shrink(x, lora.gu_a, lora.gu_scale, lora.rank, by_es, sg, K, R, gather=True, nsl=2, prec=prec)
    act = new(P, inter)
    _expand(h, sg, lora.gu_b, lora.rank, by_es, rw, act, inter, R, silu=True, prec=prec)
    y = new(P, H)
    _gemm(act, down, by_e, rw, y, K, H, inter, gather=False, silu=False, weight=False, prec=prec)
    sd = new(P, R)
    _shrink(act, lora.dn_a, lora.dn_scale, lora.rank, by_es, sd, K, R, gather=False, nsl=1, prec=prec)
    _expand(y, sd, lora.dn_b, lora.rank, by_es, rw, y, H, R, silu=False, prec=prec)  # in place, row by row
    return y.view(T, K, H).sum(dim=1, dtype=torch.float32).to(x.dtype)


def _gemm(src, w, al: MoeAlign, rw, out, top_k, n_out, inter, *, gather, silu, weight, prec) -> None:
    """`_expert_gemm_kernel` over the expert-sorted blocks: w [E, n_out (x2 with silu), KD], out [T*K, n_out]."""
    tiles = triton.cdiv(n_out, BN)
    launch(
        _expert_gemm_kernel, (al.num_blocks * tiles,), src, w, al.sorted_pair, al.block_expert, rw, out,
        w.shape[2], n_out, inter, top_k, tiles,
        src.stride(0), w.stride(0), w.stride(1), out.stride(0),
        GATHER=gather, SILU=silu, WEIGHT=weight, BM=al.block_m, BN=BN, BK=BK, DOT_PREC=prec,
    )  # fmt: skip


def _shrink(src, a, scale, rank, al: MoeAlign, out, top_k, R, *, gather, nsl, prec) -> None:
    """`_lora_shrink_kernel` over the (expert, slot) blocks: a [L, E, nsl*R, KD], out [T*K, nsl*R]."""
    launch(
        _lora_shrink_kernel, (al.num_blocks,), src, a, scale, rank, al.sorted_pair, al.block_expert, al.block_slot,
        out, a.shape[3], top_k, R,
        src.stride(0), a.stride(0), a.stride(1), a.stride(2), scale.stride(0), out.stride(0),
        GATHER=gather, NSL=nsl, RB=rank_bucket(R), BM=al.block_m, BK=BK, DOT_PREC=prec,
    )  # fmt: skip


def _expand(inp, sh, b, rank, al: MoeAlign, rw, out, n_out, R, *, silu, prec) -> None:
    """`_lora_expand_kernel` over the (expert, slot) blocks: b [L, E, n_out (x2 with silu), R (x2 with silu)]."""
    launch(
        _lora_expand_kernel, (al.num_blocks,), inp, sh, b, rank, al.sorted_pair, al.block_expert,
        al.block_slot, rw, out, n_out, R,
        inp.stride(0), sh.stride(0), b.stride(0), b.stride(1), b.stride(2), out.stride(0),
        SILU=silu, RB=rank_bucket(R), BM=al.block_m, BN=BN, DOT_PREC=prec,
    )  # fmt: skip
