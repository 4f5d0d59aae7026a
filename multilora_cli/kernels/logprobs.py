"""Logprob rows of fp32 logits in one read of the logits: log-softmax at a target, argmax and top-k, fused.

    for r in range(R):                      # x: [R, V] float32, unit last stride (row stride any); V >= k
        lse = log(sum_v exp(x[r, v]))       # targets: [R] int64 in [0, V); k: 0..20 (a Python int)
        out[r, 0] = x[r, targets[r]] - lse  # out: [R, 2 + 2k] float32
        out[r, 1] = argmax_v x[r, v]        # the lowest index among equal maxima (torch.argmax's), as a float
        order = sorted(range(V), key=lambda v: (-x[r, v], v))   # value descending, then index ascending
        for j in range(k):
            out[r, 2 + 2j] = order[j]       # token id as a float (exact: ids < 2^24)
            out[r, 3 + 2j] = x[r, order[j]] - lse

Logits are finite or -inf (no NaN). Ties in the top k go to the lowest index first; torch.topk leaves their order
unspecified (on CPU it returned [8, 6, 7] for the top 3 of ten zeros), so the torch reference `logprob_rows_torch`
ranks unique int64 keys (the fp32 bits in float order, then the index reversed) with torch.topk: the same order,
exactly.

Two Triton launches (`logprob_rows_triton`) instead of torch's logsumexp (a max, a subtract, an exp and a sum as
separate passes and temporaries), gather, argmax and topk (a radix select of several passes) over [R, V]:
1. `_chunk_kernel`, grid (R, C = cdiv(V, BLOCK)): one tile of BLOCK logits of one row, read once, kept in
   registers: its max m, sum(exp(x - m)), the lowest index of m, and its own top k as (value, index) pairs by
   k rounds of (max, lowest index of it, drop it). A row's top k is among its tiles' top k's.
2. `_merge_kernel`, grid (R,): a row's C partials -> lse = M + log(sum_c s_c exp(m_c - M)), the argmax, and
   its top k by the same k rounds over the C * k candidates; the target's logit is read from x.
A row's numbers depend only on that row (each reduction runs in a fixed order over its own tiles): batch
invariant. Within a few fp32 ulps of torch.log_softmax (exp2 / log2 in place of exp / log, tiles summed then
merged); ids and argmax exactly the definition's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch

BLOCK = 4096  # logits per tile: a 128k vocabulary is 32 tiles a row; 256 rows are 8,192 programs
MAX_K = 20  # OpenAI's and vLLM's bound on top_logprobs
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
_BIG = tl.constexpr(2147483647)  # an index past every real one: padding sorts after every real token of equal value


@triton.jit
def _take_top(vals, idx, alive):
    """One round of top-k selection: the largest alive value, the lowest index holding it; that one leaves."""
    v = tl.max(tl.where(alive, vals, float("-inf")), axis=0)
    i = tl.min(tl.where(alive & (vals == v), idx, _BIG), axis=0)
    return v, i, alive & (idx != i)


# k, KS and C vary from step to step: not specialised on (== 1, % 16), so one variant serves them all
@triton.jit(do_not_specialize=["k", "C", "KS"])
def _chunk_kernel(x_ptr, stride_x, V, k, m_ptr, s_ptr, a_ptr, cv_ptr, ci_ptr, C, KS, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    ok = offs < V
    x = tl.load(x_ptr + r.to(tl.int64) * stride_x + offs, mask=ok, other=float("-inf"))  # [BLOCK] fp32
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # an all -inf tile: s = 0, no NaN from -inf - -inf
    s = tl.sum(tl.exp2((x - m_safe) * LOG2E), axis=0)
    a = tl.min(tl.where(ok & (x == m), offs, _BIG), axis=0)
    part = r * C + c
    tl.store(m_ptr + part, m)
    tl.store(s_ptr + part, s)
    tl.store(a_ptr + part, a)
    alive = ok
    for j in range(k):
        v, i, alive = _take_top(x, offs, alive)
        tl.store(cv_ptr + part * KS + j, v)
        tl.store(ci_ptr + part * KS + j, i)


# k's row width (stride_o = 2 + 2k) and the targets (a view at a step's row offset) change per step: not
# specialised on, so the variants are one per KB (engine/precompile.py dry-runs each k of a run's lines)
@triton.jit(do_not_specialize=["k", "C", "KS", "stride_o"], do_not_specialize_on_alignment=["t_ptr"])
def _merge_kernel(
    x_ptr,
    stride_x,
    t_ptr,
    k,
    m_ptr,
    s_ptr,
    a_ptr,
    cv_ptr,
    ci_ptr,
    C,
    KS,
    out_ptr,
    stride_o,
    CB: tl.constexpr,
    KB: tl.constexpr,
):
    r = tl.program_id(0)
    cs = tl.arange(0, CB)
    cok = cs < C
    m = tl.load(m_ptr + r * C + cs, mask=cok, other=float("-inf"))  # [CB]
    s = tl.load(s_ptr + r * C + cs, mask=cok, other=0.0)
    a = tl.load(a_ptr + r * C + cs, mask=cok, other=_BIG)
    big_m = tl.max(m, axis=0)
    m_safe = tl.where(big_m == float("-inf"), 0.0, big_m)
    total = tl.sum(s * tl.exp2((m - m_safe) * LOG2E), axis=0)
    lse = m_safe + tl.log2(total) * LN2
    argmax = tl.min(tl.where(m == big_m, a, _BIG), axis=0)
    t = tl.load(t_ptr + r)
    xt = tl.load(x_ptr + r.to(tl.int64) * stride_x + t)
    out = out_ptr + r.to(tl.int64) * stride_o
    tl.store(out, xt - lse)
    tl.store(out + 1, argmax.to(tl.float32))
    # the C tiles' k candidates each: [CB, KB], padding as (-inf, _BIG)
    ks = tl.arange(0, KB)
    cand = (r * C + cs[:, None]) * KS + ks[None, :]
    live = cok[:, None] & (ks[None, :] < k)
    vals = tl.reshape(tl.load(cv_ptr + cand, mask=live, other=float("-inf")), (CB * KB,))
    idx = tl.reshape(tl.load(ci_ptr + cand, mask=live, other=_BIG), (CB * KB,))
    live = tl.reshape(live, (CB * KB,))
    for j in range(k):
        v, i, live = _take_top(vals, idx, live)
        tl.store(out + 2 + 2 * j, i.to(tl.float32))
        tl.store(out + 3 + 2 * j, v - lse)


def _check(x: torch.Tensor, targets: torch.Tensor, k: int) -> None:
    if x.dim() != 2 or x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"logprob rows: x must be [R, V] float32 with a unit last stride, got {x.dtype} {x.shape}")
    if targets.shape != (x.shape[0],):
        raise ValueError(f"logprob rows: targets {tuple(targets.shape)} for {x.shape[0]} rows")
    if not 0 <= k <= min(MAX_K, x.shape[1]):
        raise ValueError(f"logprob rows: k {k} outside 0..{min(MAX_K, x.shape[1])}")


def logprob_rows_triton(x: torch.Tensor, targets: torch.Tensor, k: int, block: int = BLOCK) -> torch.Tensor:
    """[R, 2 + 2k] float32 as the module docstring states, in two launches, no host sync. x: [R, V] float32;
    targets: [R] int64 on x's device; block: logits per tile (a power of two; tests use small ones)."""
    _check(x, targets, k)
    r, v = x.shape
    out = torch.empty(r, 2 + 2 * k, dtype=torch.float32, device=x.device)
    if r == 0:
        return out
    c = triton.cdiv(v, block)
    ks = max(k, 1)
    m = torch.empty(r, c, dtype=torch.float32, device=x.device)
    s = torch.empty_like(m)
    a = torch.empty(r, c, dtype=torch.int32, device=x.device)
    cv = torch.empty(r, c, ks, dtype=torch.float32, device=x.device)  # each tile's top k: values, indices
    ci = torch.empty(r, c, ks, dtype=torch.int32, device=x.device)
    launch(_chunk_kernel, (r, c), x, x.stride(0), v, k, m, s, a, cv, ci, c, ks, BLOCK=block, num_warps=8)
    launch(
        _merge_kernel,
        (r,),
        x,
        x.stride(0),
        targets,
        k,
        m,
        s,
        a,
        cv,
        ci,
        c,
        ks,
        out,
        out.stride(0),
        CB=triton.next_power_of_2(c),
        KB=triton.next_power_of_2(ks),
        num_warps=4,
    )
    return out


def logprob_rows_torch(x: torch.Tensor, targets: torch.Tensor, k: int) -> torch.Tensor:
    """The same [R, 2 + 2k] in torch ops (the CPU path and the kernel's reference)."""
    _check(x, targets, k)
    lse = torch.logsumexp(x, dim=-1, keepdim=True)  # [R, 1]
    cols = [x.gather(1, targets[:, None]) - lse, x.argmax(dim=-1, keepdim=True).float()]
    if k:
        # unique keys in the order (value descending, index ascending): the fp32 bits made monotone (+0.0 for a
        # -0.0 first, which compares equal to it), times 2^32, plus V - 1 - index
        bits = (x + 0.0).view(torch.int32)
        mono = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()
        rev = (x.shape[1] - 1 - torch.arange(x.shape[1], device=x.device)).long()
        top = torch.topk(mono * (1 << 32) + rev, k, dim=-1).indices  # [R, k]
        pairs = torch.stack([top.float(), x.gather(1, top) - lse], dim=-1)  # [R, k, 2]
        cols.append(pairs.flatten(1))
    return torch.cat(cols, dim=1)


__all__ = ["BLOCK", "MAX_K", "logprob_rows_torch", "logprob_rows_triton"]
