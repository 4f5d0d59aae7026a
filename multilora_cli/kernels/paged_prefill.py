"""Prefill attention in Triton: the new tokens of each sequence attend causally to its cached prefix (read
through its block table) and to themselves, with an online softmax in float32 (see paged_attention.py for
the cache layout)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.online_softmax import logit_scales, online_softmax_step


@triton.jit(do_not_specialize=["stride_bt"])  # block-table width varies step to step: one compile
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    block_tables_ptr,
    cu_q_ptr,
    cu_k_ptr,
    out_ptr,
    qk_scale,
    cap_scale,
    window,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
    IEEE: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    mt = tl.program_id(0)
    b = tl.program_id(1)
    kvh = tl.program_id(2)
    q0 = tl.load(cu_q_ptr + b)
    lq = tl.load(cu_q_ptr + b + 1) - q0
    k0 = tl.load(cu_k_ptr + b)
    lk = tl.load(cu_k_ptr + b + 1) - k0
    prefix = lk - lq  # new token i sits at position prefix + i
    m0 = mt * BLOCK_M

    # rows = BLOCK_M tokens x BLOCK_G query heads of this kv head (K/V tiles are shared by the group)
    rows = tl.arange(0, BLOCK_M * BLOCK_G)
    tok = m0 + rows // BLOCK_G
    g = rows % BLOCK_G
    rmask = (tok < lq) & (g < GROUP)
    qpos = prefix + tok
    wlo = tl.where(window > 0, qpos - window, -1)  # keys must sit above this position
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    head = kvh * GROUP + g
    q = tl.load(
        q_ptr + (q0 + tok)[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=rmask[:, None] & dmask[None, :],
        other=0.0,
    )  # [R, D]

    # keys this tile can see: up to its last query's position; from its first query's window start
    hi = tl.minimum(lk, prefix + m0 + BLOCK_M)
    lo = tl.where(window > 0, tl.maximum(prefix + m0 - window + 1, 0), 0)
    start = (lo // BLOCK_N) * BLOCK_N
    hi = tl.where(m0 < lq, hi, start)  # tiles past this sequence's queries do nothing

    m_i = tl.full([BLOCK_M * BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M * BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], tl.float32)
    for n in range(start, hi, BLOCK_N):
        kpos = n + tl.arange(0, BLOCK_N)
        # (>= lo: a table entry behind the window may be a dropped block, -1: never loaded, not masked after)
        kmask = (kpos < hi) & (kpos >= lo)
        if PAGED:
            page = tl.load(block_tables_ptr + b * stride_bt + kpos // PAGE, mask=kmask, other=0).to(tl.int64)
            k_off = page[:, None] * stride_kb + (kpos % PAGE)[:, None] * stride_ks
            v_off = page[:, None] * stride_vb + (kpos % PAGE)[:, None] * stride_vs
        else:  # keys are the step's own packed k/v rows
            k_off = (k0 + kpos)[:, None].to(tl.int64) * stride_ks
            v_off = (k0 + kpos)[:, None].to(tl.int64) * stride_vs
        kv_mask = kmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + k_off + kvh * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)  # [N, D]
        v = tl.load(v_ptr + v_off + kvh * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)  # [N, D]
        visible = kmask[None, :] & (kpos[None, :] <= qpos[:, None]) & (kpos[None, :] > wlo[:, None])  # [R, N]
        m_i, l_i, acc = online_softmax_step(q, k, v, visible, qk_scale, cap_scale, m_i, l_i, acc, IEEE, SOFTCAP)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + (q0 + tok)[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=rmask[:, None] & dmask[None, :],
    )


def paged_attention_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    scale: float,
    *,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    block_tables: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    block_n: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal varlen attention of B packed sequences in one launch.

    q: [T, H, D] new tokens (sequence b = rows cu_seqlens_q[b]:cu_seqlens_q[b+1]); new token i of b sits at
    position (len_k - len_q) + i and sees keys at positions <= its own (and > own - sliding_window).
    With `block_tables` (and caches holding every context token, new ones included) keys/values are read
    from the paged cache, so a cached prefix is attended to (with a window, the entries of blocks wholly before
    the window of the sequence's first new token are never read: they may be -1, dropped blocks, see
    engine/block_manager.py); without, k/v: [T, KVH, D] are the keys and
    cu_seqlens_k must equal cu_seqlens_q. `softcap`: scores become tanh(s / softcap) * softcap (Gemma 2).
    Returns [T, H, D] in q's dtype.
    """
    T, H, D = q.shape
    out = torch.empty_like(q) if out is None else out
    if T == 0:
        return out
    paged = block_tables is not None
    src_k, src_v = (k_cache, v_cache) if paged else (k, v)
    kvh = src_k.shape[-2]
    if H % kvh:
        raise ValueError(f"{H} query heads do not group over {kvh} kv heads")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if src_k.stride(-1) != 1:
        src_k = src_k.contiguous()
    if src_v.stride(-1) != 1:
        src_v = src_v.contiguous()
    group = H // kvh
    block_g = triton.next_power_of_2(group)
    block_m = max(1, 64 // block_g) if block_g <= 64 else 1
    block_m = max(block_m, -(-16 // block_g))  # >= 16 rows for tl.dot
    block_d = max(16, triton.next_power_of_2(D))
    block_n = block_n or (64 if block_d <= 128 else 32)
    if paged:
        page = src_k.shape[1]
        sk = (src_k.stride(0), src_k.stride(1), src_k.stride(2))
        sv = (src_v.stride(0), src_v.stride(1), src_v.stride(2))
        bt_stride = block_tables.stride(0)
    else:
        page = 1
        sk = (0, src_k.stride(0), src_k.stride(1))
        sv = (0, src_v.stride(0), src_v.stride(1))
        block_tables, bt_stride = cu_seqlens_q, 0  # unused
    B = cu_seqlens_q.shape[0] - 1
    grid = (triton.cdiv(max_seqlen_q, block_m), B, kvh)
    launch(
        _prefill_kernel,
        grid,
        q,
        src_k,
        src_v,
        block_tables,
        cu_seqlens_q,
        cu_seqlens_k,
        out,
        *logit_scales(scale, softcap),
        int(sliding_window or 0),
        q.stride(0),
        q.stride(1),
        *sk,
        *sv,
        bt_stride,
        out.stride(0),
        out.stride(1),
        GROUP=group,
        BLOCK_G=block_g,
        BLOCK_M=block_m,
        HEAD_DIM=D,
        BLOCK_D=block_d,
        PAGE=page,
        BLOCK_N=block_n,
        PAGED=paged,
        IEEE=q.dtype == torch.float32,
        SOFTCAP=bool(softcap),
        num_warps=4,
    )
    return out
