"""Attention over the paged KV cache, driven by the step's `StepContext`.

Every step first writes the new tokens' k/v into the cache (by `slot_mapping`), then:
- prefill: causal attention of each sequence's new tokens over its context. Without a cached prefix the
  keys are the step's own k/v; with one (chunked prefill, k longer than q) they are read back from the
  sequence's blocks. CUDA: one Triton varlen launch for all sequences; CPU: torch SDPA per sequence.
- decode: one token per sequence over its blocks: the Triton paged kernel on CUDA, padded torch SDPA on CPU.
GQA: query head h uses kv head h // (num_heads // num_kv_heads). Optional sliding window (Mistral, Gemma's
local layers, Phi-3): a query at position p sees keys at positions (p - window, p]. Optional logit soft-capping
(Gemma 2): scores s = q.k * scale become tanh(s / cap) * cap before the softmax (the torch path then computes
the softmax itself, as transformers' eager attention does; SDPA has no soft-capping).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from multilora_cli.layers.context import StepContext, get_context


class Attention(nn.Module):
    """forward(q [T, H, D], k [T, KVH, D], v [T, KVH, D]) -> [T, H, D]; cache set by `set_cache`.

    `use_triton` (per module): None = Triton kernels on CUDA tensors only, the torch path elsewhere; True forces
    the kernels (tests run them on CPU tensors under TRITON_INTERPRET=1); False forces the torch path.
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        sliding_window: int | None = None,
        use_triton: bool | None = None,
        softcap: float | None = None,
    ):
        super().__init__()
        self.use_triton = use_triton
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.scale = scale
        self.sliding_window = sliding_window or None
        self.softcap = softcap or None
        self.k_cache: torch.Tensor | None = None  # [num_blocks, block_size, KVH, D]
        self.v_cache: torch.Tensor | None = None

    def set_cache(self, k_cache: torch.Tensor | None, v_cache: torch.Tensor | None) -> None:
        self.k_cache, self.v_cache = k_cache, v_cache

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_context()
        if ctx is None:
            raise RuntimeError("attention called outside a step: set_context(StepContext(...)) first")
        if self.k_cache is not None:
            self._store(k, v, ctx.slot_mapping)
        elif not ctx.is_prefill or ctx.has_prefix:
            raise RuntimeError("this step reads the KV cache but none is allocated (allocate_kv_cache)")
        if ctx.is_prefill and ctx.block_tables is None and ctx.has_prefix:
            raise RuntimeError("a prefill with a cached prefix needs block_tables in its StepContext")
        if ctx.is_prefill:
            return self._prefill(q, k, v, ctx)
        return self._decode(q, ctx)

    # k/v store ------------------------------------------------------------------------------------
    def _triton(self, x: torch.Tensor) -> bool:
        return x.is_cuda if self.use_triton is None else self.use_triton

    def _store(self, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        if self._triton(k):
            from multilora_cli.kernels.kv_store import store_kv

            store_kv(k, v, self.k_cache, self.v_cache, slot_mapping)
            return
        keep = slot_mapping >= 0  # CPU: masking costs no device sync
        slots = slot_mapping[keep]
        self.k_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, slots, k[keep])
        self.v_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, slots, v[keep])

    def _gather(self, table: torch.Tensor, first: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached tokens at positions first * page .. n - 1 of a sequence with block-table row `table` (from its
        block `first`: the ones before may be dropped, -1): k, v [n - first * page, KVH, D]."""
        page = self.k_cache.shape[1]
        blocks = table[first : -(-n // page)].long()
        k = self.k_cache.index_select(0, blocks).flatten(0, 1)[: n - first * page]
        v = self.v_cache.index_select(0, blocks).flatten(0, 1)[: n - first * page]
        return k, v

    # prefill --------------------------------------------------------------------------------------
    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        if self._triton(q):
            from multilora_cli.kernels.paged_prefill import paged_attention_prefill

            paged = ctx.block_tables is not None and self.k_cache is not None
            return paged_attention_prefill(
                q,
                k,
                v,
                ctx.cu_seqlens_q,
                ctx.cu_seqlens_k if paged else ctx.cu_seqlens_q,
                ctx.max_seqlen_q or max(ctx.seqlens_q),
                self.scale,
                k_cache=self.k_cache if paged else None,
                v_cache=self.v_cache if paged else None,
                block_tables=ctx.block_tables if paged else None,
                sliding_window=self.sliding_window,
                softcap=self.softcap,
            )
        lens_q = ctx.seqlens_q or ctx.cu_seqlens_q.diff().tolist()
        lens_k = ctx.seqlens_k or ctx.cu_seqlens_k.diff().tolist()
        out = torch.empty_like(q)
        start = 0
        for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
            if lq == 0:
                continue
            k0 = 0  # position of the first key read
            if lk == lq:
                kb, vb = k[start : start + lq], v[start : start + lq]
            else:  # keys from the block of the first new token's window on (earlier blocks may be dropped)
                page = self.k_cache.shape[1]
                first = max(0, lk - lq - self.sliding_window + 1) // page if self.sliding_window else 0
                kb, vb = self._gather(ctx.block_tables[b], first, lk)
                k0 = first * page
            out[start : start + lq] = self._sdpa_causal(q[start : start + lq], kb, vb, k0)
            start += lq
        return out

    def _sdpa_causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k0: int = 0) -> torch.Tensor:
        # q: [Lq, H, D] at positions Lk-Lq .. Lk-1; k, v: [Lk - k0, KVH, D] at positions k0 .. Lk-1
        lq, lk = q.shape[0], k0 + k.shape[0]
        qt = q.transpose(0, 1)[None]  # [1, H, Lq, D]
        kt = k.transpose(0, 1).repeat_interleave(self.group, dim=0)[None]  # [1, H, Lk - k0, D]
        vt = v.transpose(0, 1).repeat_interleave(self.group, dim=0)[None]
        if lq == lk and self.sliding_window is None and self.softcap is None:
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=self.scale)
        else:
            qpos = torch.arange(lk - lq, lk, device=q.device)[:, None]
            kpos = torch.arange(k0, lk, device=q.device)[None, :]
            mask = kpos <= qpos
            if self.sliding_window is not None:
                mask &= kpos > qpos - self.sliding_window
            o = self._sdpa(qt, kt, vt, mask)
        return o[0].transpose(0, 1)  # [Lq, H, D]

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T * scale (soft-capped) where mask) v: q [B, H, Lq, D], k/v [B, H, Lk, D], mask bool
        broadcastable to [B, H, Lq, Lk]. Soft-capped: transformers' eager attention (scores and probabilities in
        q's dtype, the softmax in float32)."""
        if self.softcap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        s = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        s = torch.tanh(s / self.softcap) * self.softcap
        s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(p, v)

    # decode ---------------------------------------------------------------------------------------
    def _decode(self, q: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        # q: [B, H, D], one token per sequence
        if self._triton(q):
            from multilora_cli.kernels.paged_attention import paged_attention_decode

            return paged_attention_decode(
                q,
                self.k_cache,
                self.v_cache,
                ctx.block_tables,
                ctx.context_lens,
                self.scale,
                sliding_window=self.sliding_window,
                softcap=self.softcap,
                max_context_len=ctx.max_seqlen_k,
            )
        return self._decode_torch(q, ctx)

    def _decode_torch(self, q: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        lens = ctx.seqlens_k or ctx.context_lens.tolist()
        page = self.k_cache.shape[1]
        nblocks = max(1, -(-max(lens) // page))
        n = torch.tensor(lens, device=q.device)[:, None]  # [B, 1]
        if self.sliding_window is None:
            first = torch.zeros_like(n)
            tables = ctx.block_tables[:, :nblocks].long()  # [B, nb]
        else:  # each row reads nb blocks from its window's first one (blocks before it may be dropped, -1)
            first = (n - self.sliding_window).clamp_min(0) // page  # [B, 1]
            nblocks = min(nblocks, -(-(self.sliding_window - 1) // page) + 1)
            cols = (first + torch.arange(nblocks, device=q.device)[None, :]).clamp_max(ctx.block_tables.shape[1] - 1)
            tables = ctx.block_tables.long().gather(1, cols)  # [B, nb] (clamped columns: past n, masked)
        k = self.k_cache[tables].flatten(1, 2)  # [B, S, KVH, D], S = nb * page
        v = self.v_cache[tables].flatten(1, 2)
        k = k.transpose(1, 2).repeat_interleave(self.group, dim=1)  # [B, H, S, D]
        v = v.transpose(1, 2).repeat_interleave(self.group, dim=1)
        pos = first * page + torch.arange(k.shape[2], device=q.device)[None, :]  # [B, S] positions read
        mask = pos < n
        if self.sliding_window is not None:
            mask &= pos >= n - self.sliding_window
        mask[:, 0] |= n[:, 0] == 0  # empty rows: keep softmax finite (output unused)
        o = self._sdpa(q[:, :, None, :], k, v, mask[:, None, None, :])
        return o[:, :, 0, :]  # [B, H, D]
