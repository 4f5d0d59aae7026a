"""Paged attention over the block KV cache, in Triton.

Cache layout (per layer): k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], a token at
flat slot s = block_id * block_size + offset. A sequence owns the blocks listed in its block-table row.

- `store_kv`: write each new token's k/v row to its slot (slot -1 = skip; no host sync, graph-capturable).
- `paged_attention_decode`: one query token per sequence attends to its `context_lens[b]` cached tokens.
  One program per (sequence, kv head, split) handles all query heads of that kv head (GQA: K/V are read once
  per group), walks only the sequence's own blocks, and keeps an online softmax in float32. Long contexts
  with few sequences are split along the context (flash-decoding) and merged by log-sum-exp.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, stride_k, stride_v,
                     ROW: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < tl.where(slot >= 0, ROW, 0)  # slot -1: nothing to write
    k = tl.load(k_ptr + t * stride_k + offs, mask=mask)
    v = tl.load(v_ptr + t * stride_v + offs, mask=mask)
    tl.store(k_cache_ptr + slot * ROW + offs, k, mask=mask)
    tl.store(v_cache_ptr + slot * ROW + offs, v, mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v: [T, kv_heads, head_dim] (row stride free, each row contiguous) -> cache rows slot_mapping[t]."""
    T, kvh, d = k.shape
    if T == 0:
        return
    row = kvh * d
    if k.stride(2) != 1 or k.stride(1) != d:
        k = k.contiguous()
    if v.stride(2) != 1 or v.stride(1) != d:
        v = v.contiguous()
    _store_kv_kernel[(T,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0),
                           ROW=row, BLOCK=triton.next_power_of_2(row))


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr, m_ptr, l_ptr,
    scale_log2, part_size, window,
    stride_qb, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    stride_ob, stride_oh, stride_os,
    stride_mb, stride_mh,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, IEEE: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    ctx_len = tl.load(context_lens_ptr + b)
    # sliding window: only the last `window` tokens are visible (window 0 = all)
    lo = tl.where(window > 0, tl.maximum(ctx_len - window, 0), 0)
    start = tl.maximum(s * part_size, (lo // BLOCK_N) * BLOCK_N)
    end = tl.minimum((s + 1) * part_size, ctx_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + offs_g
    gmask = offs_g < GROUP
    dmask = offs_d < HEAD_DIM
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=gmask[:, None] & dmask[None, :], other=0.0)  # [G, D]

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n in range(start, end, BLOCK_N):
        offs_n = n + tl.arange(0, BLOCK_N)
        nmask = (offs_n < end) & (offs_n >= lo)
        page = tl.load(block_tables_ptr + b * stride_bt + offs_n // PAGE, mask=nmask, other=0).to(tl.int64)
        within = offs_n % PAGE
        kv_mask = nmask[:, None] & dmask[None, :]
        k = tl.load(k_cache_ptr + page[:, None] * stride_kb + within[:, None] * stride_ks + kvh * stride_kh
                    + offs_d[None, :], mask=kv_mask, other=0.0)  # [N, D]
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        scores = tl.where(nmask[None, :], scores * scale_log2, float("-inf"))  # [G, N], log2 domain
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + page[:, None] * stride_vb + within[:, None] * stride_vs + kvh * stride_vh
                    + offs_d[None, :], mask=kv_mask, other=0.0)  # [N, D]
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    omask = gmask[:, None] & dmask[None, :]
    if SPLIT:
        # unnormalised partials; merged by _merge_splits
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + s * stride_os + offs_d[None, :], acc,
                 mask=omask)
        tl.store(m_ptr + b * stride_mb + heads * stride_mh + s, m_i, mask=gmask)
        tl.store(l_ptr + b * stride_mb + heads * stride_mh + s, l_i, mask=gmask)
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=omask)


def _merge_splits(acc: torch.Tensor, m: torch.Tensor, l: torch.Tensor, out: torch.Tensor) -> None:
    """acc: [B, H, S, D], m/l: [B, H, S] (log2 domain) -> out: [B, H, D] softmax-weighted merge."""
    m_max = m.amax(dim=-1, keepdim=True)  # [B, H, 1]
    w = torch.where(l > 0, torch.exp2(m - torch.where(torch.isfinite(m_max), m_max, 0.0)), 0.0)  # [B, H, S]
    denom = (l * w).sum(-1, keepdim=True).clamp_min(1e-30)  # [B, H, 1]
    out.copy_(((acc * w[..., None]).sum(-2) / denom).to(out.dtype))


def default_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, device: torch.device) -> int:
    """Split the context when (sequences x kv heads) alone would leave most of the GPU idle."""
    if max_context_len <= 512 or device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    programs = num_seqs * num_kv_heads
    if programs >= sms:
        return 1
    return max(1, min(math.ceil(2 * sms / programs), math.ceil(max_context_len / 256), 64))


def paged_attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float, *,
                           sliding_window: int | None = None, max_context_len: int = 0,
                           num_splits: int | None = None, block_n: int | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention of one new token per sequence over its cached context.

    q: [B, H, D]; k_cache/v_cache: [num_blocks, block_size, KVH, D]; block_tables: [B, max_blocks] int32;
    context_lens: [B] int32 (tokens incl. the new one, already stored). Returns out: [B, H, D] (q's dtype).
    `max_context_len` (an upper bound, host int) lets long contexts be split over more programs; with
    `num_splits` > 1 it is required. `block_n`: context tokens per inner step (power of two >= 16).
    Sequences of context length 0 get zeros.
    """
    B, H, D = q.shape
    _, page, kvh, _ = k_cache.shape
    if H % kvh:
        raise ValueError(f"{H} query heads do not group over {kvh} kv heads")
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty_like(q) if out is None else out
    if B == 0:
        return out
    if num_splits is None:
        num_splits = default_num_splits(B, kvh, max_context_len, q.device)
    group = H // kvh
    block_d = max(16, triton.next_power_of_2(D))
    block_n = block_n or (64 if block_d <= 128 else 32)
    if num_splits > 1:
        if max_context_len <= 0:
            raise ValueError("num_splits > 1 needs max_context_len")
        part = triton.cdiv(triton.cdiv(max_context_len, num_splits), block_n) * block_n
        num_splits = triton.cdiv(max_context_len, part)
    else:
        part = 1 << 30
    split = num_splits > 1
    if split:
        acc = torch.empty(B, H, num_splits, D, dtype=torch.float32, device=q.device)
        m = torch.empty(B, H, num_splits, dtype=torch.float32, device=q.device)
        l = torch.empty_like(m)
        dst, so = acc, acc.stride(2)
    else:
        m = l = out  # unused
        dst, so = out, 0
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    _paged_decode_kernel[(B, kvh, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, dst, m, l,
        scale * 1.4426950408889634, part, int(sliding_window or 0),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        dst.stride(0), dst.stride(1), so,
        m.stride(0) if split else 0, m.stride(1) if split else 0,
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=D, BLOCK_D=block_d,
        PAGE=page, BLOCK_N=block_n, SPLIT=split, IEEE=q.dtype == torch.float32,
        num_warps=4,
    )
    if split:
        _merge_splits(acc, m, l, out)
    return out


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, block_tables_ptr, cu_q_ptr, cu_k_ptr, out_ptr,
    scale_log2, window,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    stride_ot, stride_oh,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr, IEEE: tl.constexpr,
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
    q = tl.load(q_ptr + (q0 + tok)[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=rmask[:, None] & dmask[None, :], other=0.0)  # [R, D]

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
        kmask = kpos < hi
        if PAGED:
            page = tl.load(block_tables_ptr + b * stride_bt + kpos // PAGE, mask=kmask, other=0).to(tl.int64)
            k_off = page[:, None] * stride_kb + (kpos % PAGE)[:, None] * stride_ks
            v_off = page[:, None] * stride_vb + (kpos % PAGE)[:, None] * stride_vs
        else:  # keys are the step's own packed k/v rows
            k_off = (k0 + kpos)[:, None].to(tl.int64) * stride_ks
            v_off = (k0 + kpos)[:, None].to(tl.int64) * stride_vs
        kv_mask = kmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + k_off + kvh * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)  # [N, D]
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        visible = kmask[None, :] & (kpos[None, :] <= qpos[:, None]) & (kpos[None, :] > wlo[:, None])
        s = tl.where(visible, s * scale_log2, float("-inf"))  # [R, N]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + v_off + kvh * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + (q0 + tok)[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])


def paged_attention_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                            cu_seqlens_k: torch.Tensor, max_seqlen_q: int, scale: float, *,
                            k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None,
                            block_tables: torch.Tensor | None = None, sliding_window: int | None = None,
                            block_n: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal varlen attention of B packed sequences in one launch.

    q: [T, H, D] new tokens (sequence b = rows cu_seqlens_q[b]:cu_seqlens_q[b+1]); new token i of b sits at
    position (len_k - len_q) + i and sees keys at positions <= its own (and > own - sliding_window).
    With `block_tables` (and caches holding every context token, new ones included) keys/values are read
    from the paged cache, so a cached prefix is attended to; without, k/v: [T, KVH, D] are the keys and
    cu_seqlens_k must equal cu_seqlens_q. Returns [T, H, D] in q's dtype.
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
    _prefill_kernel[grid](
        q, src_k, src_v, block_tables, cu_seqlens_q, cu_seqlens_k, out,
        scale * 1.4426950408889634, int(sliding_window or 0),
        q.stride(0), q.stride(1), *sk, *sv, bt_stride, out.stride(0), out.stride(1),
        GROUP=group, BLOCK_G=block_g, BLOCK_M=block_m, HEAD_DIM=D, BLOCK_D=block_d, PAGE=page, BLOCK_N=block_n,
        PAGED=paged, IEEE=q.dtype == torch.float32, num_warps=4,
    )
    return out
