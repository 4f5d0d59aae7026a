"""Paged attention over the block KV cache, in Triton.

Cache layout (per layer): k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], a token at
flat slot s = block_id * block_size + offset. A sequence owns the blocks listed in its block-table row.

- `store_kv` (kv_store.py): write each new token's k/v row to its slot (slot -1 = skip; graph-capturable).
- `paged_attention_prefill` (paged_prefill.py): the new tokens of each sequence, causally, over its prefix.
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

from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.online_softmax import logit_scales, online_softmax_step


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    m_ptr,
    l_ptr,
    qk_scale,
    cap_scale,
    part_size,
    window,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    stride_ob,
    stride_oh,
    stride_os,
    stride_mb,
    stride_mh,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    IEEE: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    ctx_len = tl.load(context_lens_ptr + b)
    # sliding window: only the last `window` tokens are visible (window 0 = all); the splits partition the tiles
    # from the window's first one, so every split has work and no tile before the window is read
    lo = tl.where(window > 0, tl.maximum(ctx_len - window, 0), 0)
    first = (lo // BLOCK_N) * BLOCK_N
    start = first + s * part_size
    end = tl.minimum(first + (s + 1) * part_size, ctx_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + offs_g
    gmask = offs_g < GROUP
    dmask = offs_d < HEAD_DIM
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=gmask[:, None] & dmask[None, :],
        other=0.0,
    )  # [G, D]

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n in range(start, end, BLOCK_N):
        offs_n = n + tl.arange(0, BLOCK_N)
        nmask = (offs_n < end) & (offs_n >= lo)
        page = tl.load(block_tables_ptr + b * stride_bt + offs_n // PAGE, mask=nmask, other=0).to(tl.int64)
        within = offs_n % PAGE
        kv_mask = nmask[:, None] & dmask[None, :]
        k = tl.load(
            k_cache_ptr + page[:, None] * stride_kb + within[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )  # [N, D]
        v = tl.load(
            v_cache_ptr + page[:, None] * stride_vb + within[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )  # [N, D]
        m_i, l_i, acc = online_softmax_step(q, k, v, nmask[None, :], qk_scale, cap_scale, m_i, l_i, acc, IEEE, SOFTCAP)

    omask = gmask[:, None] & dmask[None, :]
    if SPLIT:
        # unnormalised partials; merged by _merge_splits
        tl.store(
            out_ptr + b * stride_ob + heads[:, None] * stride_oh + s * stride_os + offs_d[None, :], acc, mask=omask
        )
        tl.store(m_ptr + b * stride_mb + heads * stride_mh + s, m_i, mask=gmask)
        tl.store(l_ptr + b * stride_mb + heads * stride_mh + s, l_i, mask=gmask)
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=omask,
        )


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


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    max_context_len: int = 0,
    num_splits: int | None = None,
    block_n: int | None = None,
    out: torch.Tensor | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """Decode attention of one new token per sequence over its cached context.

    q: [B, H, D]; k_cache/v_cache: [num_blocks, block_size, KVH, D]; block_tables: [B, max_blocks] int32;
    context_lens: [B] int32 (tokens incl. the new one, already stored). Returns out: [B, H, D] (q's dtype).
    `sliding_window`: only the last `sliding_window` tokens are attended to, and only their tiles are read (the
    block loop starts at the window's first tile, and loads nothing before the window: block-table entries of
    blocks wholly before it may be -1, dropped blocks, engine/block_manager.py). `softcap`: scores become tanh(s / softcap) * softcap (Gemma 2).
    `max_context_len` (an upper bound, host int) lets long contexts be split over more programs; with
    `num_splits` > 1 it is required. `block_n`: context tokens per inner step (power of two >= 16);
    `num_warps` / `num_stages`: the launch's (benchmarks/bench_attention.py sweeps them).
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
    group = H // kvh
    block_d = max(16, triton.next_power_of_2(D))
    block_n = block_n or (64 if block_d <= 128 else 32)
    # tokens a sequence's splits cover: its context, or with a window the tiles from the window's first one
    span = min(max_context_len, sliding_window + block_n) if sliding_window else max_context_len
    if num_splits is None:
        num_splits = default_num_splits(B, kvh, span, q.device)
    if num_splits > 1:
        if max_context_len <= 0:
            raise ValueError("num_splits > 1 needs max_context_len")
        part = triton.cdiv(triton.cdiv(span, num_splits), block_n) * block_n
        num_splits = triton.cdiv(span, part)
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
    launch(
        _paged_decode_kernel,
        (B, kvh, num_splits),
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        dst,
        m,
        l,
        *logit_scales(scale, softcap),
        part,
        int(sliding_window or 0),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        dst.stride(0),
        dst.stride(1),
        so,
        m.stride(0) if split else 0,
        m.stride(1) if split else 0,
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=D,
        BLOCK_D=block_d,
        PAGE=page,
        BLOCK_N=block_n,
        SPLIT=split,
        IEEE=q.dtype == torch.float32,
        SOFTCAP=bool(softcap),
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if split:
        _merge_splits(acc, m, l, out)
    return out
