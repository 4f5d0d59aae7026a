"""Logits processing for the rows that ask for it, in one pass over each such row.

For each processed row i (logits row `rows[i]`, sequence-table row t = hist[i]), in this order on the raw logits,
as transformers' generate and vLLM apply them (bias before the penalties, whose repetition part is
multiplicative):
    x = logits[rows[i]] as fp32
    x[tok] += val                  for (tok, val) in bias_tok / bias_val[t, :bias_len[t]]  (logit_bias, OpenAI)
    c = counts[t]                                     (rows with a penalty: i < num_history)
    x = where(c != 0, where(x > 0, x / rep, x * rep), x)     repetition penalty, prompt + generated  (transformers)
    x -= freq * gen + pres * (gen > 0)                gen = c & (SEEN_IN_PROMPT - 1), generated only   (OpenAI)
    x[tok] = -inf                  for tok in ban_tok[t, :ban_len[t]] if ban_on[i]   (the stop set, min_tokens)
`counts`, `bias_*` and `ban_*` are the sequence table (engine/logits_processing.TokenHistory): per running
sequence that processes its logits, on the device, written once when the sequence gets its row (counts: plus
each sampled token, on the device), so a step sends only [P]-sized fields. counts[t, tok] = generated count of
tok + SEEN_IN_PROMPT where tok is in the prompt. A row's rep 1 and freq / pres 0 change no bit.
`process_block` is the definition on a block of a row, shared by the processing kernel here and the sampling
kernel's fused loads (kernels/sample.py); `process_rows_torch` is the same in torch ops (the CPU path and the
tests' reference; under TRITON_INTERPRET=1 the two agree bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch

SEEN_IN_PROMPT = 1 << 24  # counts[r, t] = generated count of t (< 2^24) + this bit when t is in the prompt
BLOCK = 2048
_SEEN = tl.constexpr(SEEN_IN_PROMPT)  # the kernels' copy: a jit function reads only constexpr globals


@dataclass(slots=True)
class ProcessPlan:
    """One step's processed rows, on the logits' device: P rows, the first `num_history` of them with a penalty,
    and the sequence table they index (R rows).

    rows: [P] int64, rows of the logits;  hist: [P] int64, their rows of the table
    rep, freq, pres: [P] fp32 (1, 0, 0 = off);  ban_on: [P] int64, 1 where the row's stop set is banned now
    bias_tok: [R, BW] int64, row t's logit_bias tokens sorted in [:bias_len[t]];  bias_val: [R, BW] fp32
    bias_len: [R] int64;  ban_tok: [R, NW] int64, row t's stop set sorted in [:ban_len[t]];  ban_len: [R] int64
    counts: [R, V] int32, or None when num_history is 0
    """

    rows: torch.Tensor
    hist: torch.Tensor
    rep: torch.Tensor
    freq: torch.Tensor
    pres: torch.Tensor
    ban_on: torch.Tensor
    bias_tok: torch.Tensor
    bias_val: torch.Tensor
    bias_len: torch.Tensor
    ban_tok: torch.Tensor
    ban_len: torch.Tensor
    num_history: int
    counts: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return self.rows.shape[0]

    def kernel_args(self) -> list:
        """The pointers and sizes `process_block` takes after `i`, in its order (WITH_COUNTS: counts is not None)."""
        counts = self.counts if self.num_history else None
        return [
            self.hist,
            counts if counts is not None else self.rep,  # (not read without counts)
            self.rep,
            self.freq,
            self.pres,
            self.ban_on,
            self.bias_tok,
            self.bias_val,
            self.bias_len,
            self.ban_tok,
            self.ban_len,
            counts.stride(0) if counts is not None else 0,
            self.bias_tok.stride(0),
            self.ban_tok.stride(0),
            self.num_history,
        ]


@triton.jit
def _lower_bound(tok_ptr, lo, hi, t):
    """The first j in [lo, hi) with tok[j] >= t (tok sorted there), else hi: a block reads only its own entries."""
    while lo < hi:
        mid = (lo + hi) // 2
        below = tl.load(tok_ptr + mid) < t
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(below, hi, mid)
    return lo


@triton.jit
def _block_entries(tok_ptr, b0, n, width, first, last):
    """[j0, j1): the entries j of the sorted list tok[b0 : b0 + n] (n <= width, its table row's) with first <=
    tok[j] < last. A list of up to 32 (the usual: a few biases, a stop set) is counted from one vector load that
    waits on no other (a binary search is a chain of dependent loads, per block of every pass it ran in: the
    latency of the processed passes); a longer one by binary search. (64 took a processing pass from 80 to 104
    registers, ptxas sm_90.)"""
    k = tl.arange(0, 32)
    tok = tl.load(tok_ptr + b0 + k, mask=k < width, other=0)
    if n <= 32:
        j0 = b0 + tl.sum(((k < n) & (tok < first)).to(tl.int64), axis=0)
        j1 = b0 + tl.sum(((k < n) & (tok < last)).to(tl.int64), axis=0)
    else:
        j0 = _lower_bound(tok_ptr, b0, b0 + n, first)
        j1 = _lower_bound(tok_ptr, b0, b0 + n, last)
    return j0, j1


@triton.jit
def process_block(
    row,
    offs,
    ok,
    first,
    i,
    hist_ptr,
    counts_ptr,
    rep_ptr,
    freq_ptr,
    pres_ptr,
    ban_on_ptr,
    bias_tok_ptr,
    bias_val_ptr,
    bias_len_ptr,
    ban_tok_ptr,
    ban_len_ptr,
    stride_counts,
    stride_bias,
    stride_ban,
    H,
    WITH_COUNTS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Processed plan row i at `offs` (= first + arange(BLOCK), tokens < V where `ok`): fp32 [BLOCK], 0 where
    not ok. `row` points at its logits row. The one definition: the processing kernel below and the sampling
    kernel's fused loads (kernels/sample.py) both call it, so both see the same bits."""
    x = tl.load(row + offs, mask=ok, other=0.0).to(tl.float32)
    t = tl.load(hist_ptr + i)
    # the row's bias / ban entries that fall in this block (a row may bias thousands of tokens), each compared
    # with the whole block: no scatter, no atomics
    j0, j1 = _block_entries(bias_tok_ptr, t * stride_bias, tl.load(bias_len_ptr + t), stride_bias, first, first + BLOCK)
    for j in range(j0, j1):
        x = tl.where(offs == tl.load(bias_tok_ptr + j), x + tl.load(bias_val_ptr + j), x)
    if WITH_COUNTS:
        if i < H:
            c = tl.load(counts_ptr + t * stride_counts + offs, mask=ok, other=0)
            gen = c & (_SEEN - 1)
            rep = tl.load(rep_ptr + i)
            x = tl.where(c != 0, tl.where(x > 0, tl.math.div_rn(x, rep), x * rep), x)
            fp = tl.load(freq_ptr + i) * gen.to(tl.float32)
            pp = tl.load(pres_ptr + i) * (gen > 0).to(tl.float32)
            x = x - (fp + pp)
    n = tl.load(ban_len_ptr + t) * tl.load(ban_on_ptr + i)
    j0, j1 = _block_entries(ban_tok_ptr, t * stride_ban, n, stride_ban, first, first + BLOCK)
    for j in range(j0, j1):
        x = tl.where(offs == tl.load(ban_tok_ptr + j), float("-inf"), x)
    return x


@triton.jit(do_not_specialize=["H", "stride_bias", "stride_ban"])  # table widths grow with a run's longest entry
def _process_kernel(
    logits_ptr,
    out_ptr,
    rows_ptr,
    hist_ptr,
    counts_ptr,
    rep_ptr,
    freq_ptr,
    pres_ptr,
    ban_on_ptr,
    bias_tok_ptr,
    bias_val_ptr,
    bias_len_ptr,
    ban_tok_ptr,
    ban_len_ptr,
    stride_counts,
    stride_bias,
    stride_ban,
    H,
    V,
    stride_logits,
    WITH_COUNTS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    first = tl.program_id(1) * BLOCK
    offs = first + tl.arange(0, BLOCK)
    ok = offs < V
    r = tl.load(rows_ptr + i)
    x = process_block(
        logits_ptr + r * stride_logits, offs, ok, first, i, hist_ptr, counts_ptr, rep_ptr, freq_ptr, pres_ptr,
        ban_on_ptr, bias_tok_ptr, bias_val_ptr, bias_len_ptr, ban_tok_ptr, ban_len_ptr, stride_counts, stride_bias,
        stride_ban, H, WITH_COUNTS, BLOCK,
    )  # fmt: skip
    tl.store(out_ptr + i.to(tl.int64) * V + offs, x, mask=ok)


def process_rows(logits: torch.Tensor, plan: ProcessPlan) -> torch.Tensor:
    """The processed rows of `logits` ([N, V], any float dtype, unit last stride): fp32 [P, V], row i from
    logits[plan.rows[i]]. One launch, no host sync."""
    p, v = plan.num_rows, logits.shape[1]
    out = torch.empty(p, v, dtype=torch.float32, device=logits.device)
    if p == 0:
        return out
    if logits.stride(-1) != 1:
        raise ValueError("process_rows: logits must have a unit last stride")
    launch(
        _process_kernel,
        (p, triton.cdiv(v, BLOCK)),
        logits,
        out,
        plan.rows,
        *plan.kernel_args(),
        v,
        logits.stride(0),
        WITH_COUNTS=bool(plan.num_history),
        BLOCK=BLOCK,
        num_warps=4,
    )
    return out


def _entries(tok: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(plan row, column) of each entry j < n[i] of the [P, W] rows `tok`."""
    keep = torch.arange(tok.shape[1], device=tok.device).unsqueeze(0) < n.unsqueeze(1)
    return keep.nonzero(as_tuple=True)


def process_rows_torch(logits: torch.Tensor, plan: ProcessPlan) -> torch.Tensor:
    """`process_rows` in torch ops: fp32 [P, V]."""
    x = logits.index_select(0, plan.rows).float()
    t = plan.hist
    i, j = _entries(plan.bias_tok, plan.bias_len[t])
    x.index_put_((i, plan.bias_tok[t[i], j]), plan.bias_val[t[i], j], accumulate=True)
    h = plan.num_history
    if h:
        c = plan.counts.index_select(0, t[:h])
        gen = c & (SEEN_IN_PROMPT - 1)
        xs = x[:h]
        rep = plan.rep[:h, None]
        xs = torch.where(c != 0, torch.where(xs > 0, xs / rep, xs * rep), xs)
        x[:h] = xs - (plan.freq[:h, None] * gen.float() + plan.pres[:h, None] * (gen > 0).float())
    i, j = _entries(plan.ban_tok, plan.ban_len[t] * plan.ban_on)
    x.index_put_((i, plan.ban_tok[t[i], j]), torch.tensor(float("-inf"), device=x.device))
    return x
