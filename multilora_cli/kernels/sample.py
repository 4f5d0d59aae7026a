"""Sampling without a sort: temperature, top-k, top-p and the inverse-CDF draw, one program per row.

The sampling distribution is defined by an order on the logits, not by a sorted copy of them, so nothing is
sorted. Each logit gets an integer key whose order is the float order (`order_keys`). Then:
- top-k keeps every token whose key is >= the k-th largest key (ties at the k-th value are kept, as in
  transformers' TopKLogitsWarper);
- top-p keeps every token for which the top-k-kept mass with a strictly larger key is < top_p of the
  top-k-kept total (the smallest such set, with ties at its boundary kept);
- the token is the first one, in vocabulary order, whose running sum of kept weights exceeds u * total.
Both thresholds are found by a radix search over the keys, 4 bits per pass (16 bins of counts or masses),
so a row costs a handful of passes over its logits instead of a [V] sort (Llama-3, 256 rows: 3.7 ms with
torch.sort, see benchmarks/RESULTS.md). A row's token depends on its logits, parameters and u only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch

LOG2E = 1.4426950408889634


@triton.jit
def _keys(raw, KEY_BITS: tl.constexpr):
    """Logits (their storage dtype) -> int64 keys in [0, 2^KEY_BITS) ordered as the floats (-0 before +0)."""
    if KEY_BITS == 16:
        b = raw.to(tl.int16, bitcast=True).to(tl.int32)
        b = tl.where(b < 0, b ^ 0x7FFF, b)
        return (b + 32768).to(tl.int64)
    else:
        b = raw.to(tl.int32, bitcast=True)
        b = tl.where(b < 0, b ^ 0x7FFFFFFF, b)
        return b.to(tl.int64) + 2147483648


@triton.jit
def _weights(raw, inv_t, m):
    """exp(logit / T - m), the same expression in every pass (so every pass sees the same bits)."""
    return tl.exp2((raw.to(tl.float32) * inv_t - m) * 1.4426950408889634)


@triton.jit
def _radix_max_key(row, V, need, inv_t, m, floor_key, MASS: tl.constexpr, KEY_BITS: tl.constexpr,
                   BLOCK: tl.constexpr):
    """The largest key x with sum over {key >= max(x, floor_key)} of (weight if MASS else 1) >= need."""
    bins = tl.arange(0, 16)
    prefix = tl.zeros((), tl.int64)
    above = tl.zeros((), tl.float32)  # counted or weighed: keys above the prefix's range
    offs0 = tl.arange(0, BLOCK)
    for lvl in tl.static_range(KEY_BITS // 4):
        shift = KEY_BITS - 4 - 4 * lvl
        hist = tl.zeros((16,), tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + offs0
            ok = offs < V
            raw = tl.load(row + offs, mask=ok, other=0.0)
            key = _keys(raw, KEY_BITS)
            ok = ok & (key >= floor_key) & ((key >> (shift + 4)) == prefix)
            if MASS:
                w = tl.where(ok, _weights(raw, inv_t, m), 0.0)
            else:
                w = ok.to(tl.float32)
            digit = ((key >> shift) & 15).to(tl.int32)
            hist += tl.sum(tl.where(digit[:, None] == bins[None, :], w[:, None], 0.0), axis=0)
        suffix = tl.sum(tl.where(bins[None, :] >= bins[:, None], hist[None, :], 0.0), axis=1)  # [16]
        d = tl.maximum(tl.max(tl.where(above + suffix >= need, bins, -1), axis=0), 0)
        above += tl.sum(tl.where(bins > d, hist, 0.0), axis=0)
        prefix = prefix * 16 + d
    return prefix


@triton.jit
def _sample_kernel(logits_ptr, rows_ptr, temp_ptr, top_k_ptr, top_p_ptr, u_ptr, out_ptr, V, stride_row,
                   KEY_BITS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    r = tl.load(rows_ptr + i)
    row = logits_ptr + r * stride_row
    inv_t = 1.0 / tl.load(temp_ptr + i)
    top_k = tl.load(top_k_ptr + i)
    top_p = tl.load(top_p_ptr + i)
    offs0 = tl.arange(0, BLOCK)
    mx = tl.full((), float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + offs0
        raw = tl.load(row + offs, mask=offs < V, other=float("-inf"))
        mx = tl.maximum(mx, tl.max(raw.to(tl.float32) * inv_t, axis=0))
    tau = tl.zeros((), tl.int64)
    if top_k < V:
        tau = _radix_max_key(row, V, top_k.to(tl.float32), inv_t, mx, tau, False, KEY_BITS, BLOCK)
    if top_p < 1.0:
        total_k = tl.zeros((), tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + offs0
            ok = offs < V
            raw = tl.load(row + offs, mask=ok, other=0.0)
            total_k += tl.sum(tl.where(ok & (_keys(raw, KEY_BITS) >= tau), _weights(raw, inv_t, mx), 0.0), axis=0)
        tau = _radix_max_key(row, V, top_p * total_k, inv_t, mx, tau, True, KEY_BITS, BLOCK)
    total = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + offs0
        ok = offs < V
        raw = tl.load(row + offs, mask=ok, other=0.0)
        total += tl.sum(tl.where(ok & (_keys(raw, KEY_BITS) >= tau), _weights(raw, inv_t, mx), 0.0), axis=0)
    target = (tl.load(u_ptr + i) * total.to(tl.float64)).to(tl.float32)
    run = tl.zeros((), tl.float32)
    pick = tl.full((), 2147483647, tl.int32)
    last = tl.full((), -1, tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + offs0
        ok = offs < V
        raw = tl.load(row + offs, mask=ok, other=0.0)
        kept = ok & (_keys(raw, KEY_BITS) >= tau)
        w = tl.where(kept, _weights(raw, inv_t, mx), 0.0)
        hit = kept & (run + tl.cumsum(w, axis=0) > target)
        pick = tl.minimum(pick, tl.min(tl.where(hit, offs, 2147483647), axis=0))
        last = tl.maximum(last, tl.max(tl.where(kept, offs, -1), axis=0))
        run += tl.sum(w, axis=0)
    tl.store(out_ptr + r, tl.where(pick == 2147483647, last, pick).to(tl.int64))


def sample_rows(logits: torch.Tensor, rows: torch.Tensor, temp: torch.Tensor, top_k: torch.Tensor,
                top_p: torch.Tensor, u: torch.Tensor, out: torch.Tensor) -> None:
    """Draw one token for each row in `rows`; one program per row, no sort, no host sync.

    logits: [N, V]  fp32 | fp16 | bf16, unit column stride
    rows:   [S]     int64, the rows of `logits` (and of `out`) to sample
    temp:   [S]     fp32 > 0;  top_k: [S] int64 in [1, V] (V = off);  top_p: [S] fp32 in (0, 1] (1 = off)
    u:      [S]     fp64 in [0, 1), the row's one uniform draw
    out:    [N]     int64, written at `rows` only

        for i, r in enumerate(rows):
            s = logits[r] / temp[i];  w = exp(s - max(s));  key = order_keys(logits[r])
            kept = key >= (k-th largest key)                                   # top_k[i] < V
            kept &= [sum(w[kept & (key > key[t])]) < top_p[i] * sum(w[kept]) for t]   # top_p[i] < 1
            out[r] = first t in vocabulary order with cumsum(w * kept)[t] > u[i] * sum(w * kept)
    """
    if logits.stride(-1) != 1 or logits.dim() != 2:
        raise ValueError(f"sample_rows: logits must be [N, V] with unit last stride, got {tuple(logits.shape)}")
    if rows.numel() == 0:
        return
    bits = 32 if logits.dtype == torch.float32 else 16
    v = logits.shape[1]
    block = min(1024, triton.next_power_of_2(v))
    launch(_sample_kernel, (rows.numel(),), logits, rows, temp, top_k, top_p, u, out, v, logits.stride(0),
           KEY_BITS=bits, BLOCK=block, num_warps=8 if block >= 1024 else 4)


# --- the same semantics in torch: the CPU path and the tests' reference --------------------------------------
def order_keys(logits: torch.Tensor) -> torch.Tensor:
    """int64 keys whose order is the logits' float order, from their storage bits: [R, V]."""
    if logits.dtype == torch.float32:
        b = logits.view(torch.int32).to(torch.int64)
        return torch.where(b < 0, b ^ 0x7FFFFFFF, b) + 2147483648
    b = logits.view(torch.int16).to(torch.int64)
    return torch.where(b < 0, b ^ 0x7FFF, b) + 32768


def kept_weights(logits: torch.Tensor, temp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """exp(logits / T - max) where kept by top-k and top-p, else 0: [R, V] fp32 (unnormalised)."""
    s = logits.float() * (1.0 / temp).unsqueeze(1)  # (times the reciprocal, as the kernel does)
    w = torch.exp2((s - s.max(dim=-1, keepdim=True).values) * LOG2E)
    key = order_keys(logits)
    sk, order = key.sort(dim=-1, descending=True)
    tau_k = sk.gather(1, (top_k.clamp(1, key.shape[1]) - 1).unsqueeze(1))  # k-th largest key
    w = torch.where(key >= tau_k, w, 0.0)
    ws = w.gather(1, order)
    first = torch.ones_like(sk, dtype=torch.bool)
    first[:, 1:] = sk[:, 1:] != sk[:, :-1]
    above = ws.cumsum(dim=-1) - ws  # mass strictly above, read at the first key of each run of equal keys
    ok = first & (above < top_p.unsqueeze(1) * w.sum(dim=-1, keepdim=True)) & (sk >= tau_k)
    tau_p = torch.where(ok, sk, torch.iinfo(torch.int64).max).min(dim=-1, keepdim=True).values
    tau_p = torch.where((top_p < 1.0).unsqueeze(1), tau_p, 0)
    return torch.where(key >= tau_p, w, 0.0)


def sample_rows_torch(logits: torch.Tensor, temp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                      u: torch.Tensor) -> torch.Tensor:
    """`sample_rows` for every row of `logits` (its rows argument = all rows), in torch ops: ids [R]."""
    w = kept_weights(logits, temp, top_k, top_p)
    cum = w.cumsum(dim=-1)
    target = (u * cum[:, -1].double()).float().unsqueeze(1)
    hit = (cum > target) & (w > 0)
    v = logits.shape[1]
    pos = torch.arange(v, device=logits.device)
    pick = torch.where(hit, pos, v).min(dim=-1).values
    last = torch.where(w > 0, pos, -1).max(dim=-1).values
    return torch.where(pick == v, last, pick)
