"""Logits processing for the rows that ask for it, in one pass over each such row.

For each processed row i (logits row `rows[i]`), in this order on the raw logits, as transformers' generate and
vLLM apply them (bias before the penalties, whose repetition part is multiplicative):
    x = logits[rows[i]] as fp32
    x[t] += bias                                      for each (t, bias) of the row's logit_bias     (OpenAI)
    c = counts[hist[i]]                               (rows with a history: i < num_history)
    x = where(c != 0, where(x > 0, x / rep, x * rep), x)     repetition penalty, prompt + generated  (transformers)
    x -= freq * gen + pres * (gen > 0)                gen = c & (SEEN_IN_PROMPT - 1), generated only   (OpenAI)
    x[t] = -inf                                       for each t the row bans now (min_tokens)
`counts` holds, per history row, the generated count of each token plus SEEN_IN_PROMPT where the token is in
the prompt (engine/logits_processing.py keeps it on the device). A row's rep 1 and freq / pres 0 change no bit.
The Triton kernel runs on CUDA; `process_rows_torch` is the same definition in torch ops (the CPU path and the
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
    """One step's processed rows, on the logits' device. P rows, the first `num_history` of them with a history.

    rows:  [P] int64, rows of the logits;  hist: [P] int64, their rows of `counts` (-1 past num_history)
    rep, freq, pres: [P] fp32 (1, 0, 0 = off)
    bias_start: [P+1] int64, row i's entries are bias_tok / bias_val / bias_row[bias_start[i]:bias_start[i+1]],
                sorted by token
    ban_start:  [P+1] int64, likewise for ban_tok / ban_row (tokens set to -inf), sorted by token
    counts: [R, V] int32, or None when num_history is 0
    """

    rows: torch.Tensor
    hist: torch.Tensor
    rep: torch.Tensor
    freq: torch.Tensor
    pres: torch.Tensor
    bias_start: torch.Tensor
    bias_tok: torch.Tensor
    bias_val: torch.Tensor
    bias_row: torch.Tensor
    ban_start: torch.Tensor
    ban_tok: torch.Tensor
    ban_row: torch.Tensor
    num_history: int
    counts: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return self.rows.shape[0]


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
    bias_start_ptr,
    bias_tok_ptr,
    bias_val_ptr,
    ban_start_ptr,
    ban_tok_ptr,
    stride_counts,
    H,
    WITH_COUNTS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Processed row i of the plan at `offs` (= first + arange(BLOCK), tokens < V where `ok`): fp32 [BLOCK], 0
    where not ok. `row` points at its logits row. The one definition: the processing kernel below and the
    sampling kernel's fused loads (kernels/sample.py) both call it, so both see the same bits."""
    x = tl.load(row + offs, mask=ok, other=0.0).to(tl.float32)
    # the row's bias / ban entries that fall in this block (found by binary search: a row may bias thousands of
    # tokens), each compared with the whole block: no scatter, no atomics
    b0, b1 = tl.load(bias_start_ptr + i), tl.load(bias_start_ptr + i + 1)
    for j in range(_lower_bound(bias_tok_ptr, b0, b1, first), _lower_bound(bias_tok_ptr, b0, b1, first + BLOCK)):
        x = tl.where(offs == tl.load(bias_tok_ptr + j), x + tl.load(bias_val_ptr + j), x)
    if WITH_COUNTS:
        if i < H:
            c = tl.load(counts_ptr + tl.load(hist_ptr + i) * stride_counts + offs, mask=ok, other=0)
            gen = c & (_SEEN - 1)
            rep = tl.load(rep_ptr + i)
            x = tl.where(c != 0, tl.where(x > 0, tl.math.div_rn(x, rep), x * rep), x)
            fp = tl.load(freq_ptr + i) * gen.to(tl.float32)
            pp = tl.load(pres_ptr + i) * (gen > 0).to(tl.float32)
            x = x - (fp + pp)
    n0, n1 = tl.load(ban_start_ptr + i), tl.load(ban_start_ptr + i + 1)
    for j in range(_lower_bound(ban_tok_ptr, n0, n1, first), _lower_bound(ban_tok_ptr, n0, n1, first + BLOCK)):
        x = tl.where(offs == tl.load(ban_tok_ptr + j), float("-inf"), x)
    return x


@triton.jit(do_not_specialize=["H"])
def _process_kernel(
    logits_ptr,
    out_ptr,
    rows_ptr,
    hist_ptr,
    counts_ptr,
    rep_ptr,
    freq_ptr,
    pres_ptr,
    bias_start_ptr,
    bias_tok_ptr,
    bias_val_ptr,
    ban_start_ptr,
    ban_tok_ptr,
    V,
    stride_logits,
    stride_counts,
    H,
    WITH_COUNTS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    first = tl.program_id(1) * BLOCK
    offs = first + tl.arange(0, BLOCK)
    ok = offs < V
    r = tl.load(rows_ptr + i)
    x = process_block(
        logits_ptr + r * stride_logits,
        offs,
        ok,
        first,
        i,
        hist_ptr,
        counts_ptr,
        rep_ptr,
        freq_ptr,
        pres_ptr,
        bias_start_ptr,
        bias_tok_ptr,
        bias_val_ptr,
        ban_start_ptr,
        ban_tok_ptr,
        stride_counts,
        H,
        WITH_COUNTS,
        BLOCK,
    )
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
    counts = plan.counts if plan.num_history else None
    launch(
        _process_kernel,
        (p, triton.cdiv(v, BLOCK)),
        logits,
        out,
        plan.rows,
        plan.hist,
        counts if counts is not None else plan.rep,
        plan.rep,
        plan.freq,
        plan.pres,
        plan.bias_start,
        plan.bias_tok,
        plan.bias_val,
        plan.ban_start,
        plan.ban_tok,
        v,
        logits.stride(0),
        counts.stride(0) if counts is not None else 0,
        plan.num_history,
        WITH_COUNTS=counts is not None,
        BLOCK=BLOCK,
        num_warps=4,
    )
    return out


def process_rows_torch(logits: torch.Tensor, plan: ProcessPlan) -> torch.Tensor:
    """`process_rows` in torch ops: fp32 [P, V]."""
    x = logits.index_select(0, plan.rows).float()
    if plan.bias_tok.numel():
        x.index_put_((plan.bias_row, plan.bias_tok), plan.bias_val, accumulate=True)
    h = plan.num_history
    if h:
        c = plan.counts.index_select(0, plan.hist[:h])
        gen = c & (SEEN_IN_PROMPT - 1)
        xs = x[:h]
        rep = plan.rep[:h, None]
        xs = torch.where(c != 0, torch.where(xs > 0, xs / rep, xs * rep), xs)
        x[:h] = xs - (plan.freq[:h, None] * gen.float() + plan.pres[:h, None] * (gen > 0).float())
    if plan.ban_tok.numel():
        x.index_put_((plan.ban_row, plan.ban_tok), torch.tensor(float("-inf"), device=x.device))
    return x
