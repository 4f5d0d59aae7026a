"""Sampling without a sort: temperature, top-k, top-p, min-p and the inverse-CDF draw, all rows at once.

The sampling distribution is defined by an order on the logits, not by a sorted copy of them, so nothing is
sorted. Each logit gets an integer key whose order is the float order (`order_keys`). Then:
- top-k keeps every token whose key is >= the k-th largest key (ties at the k-th value are kept, as in
  transformers' TopKLogitsWarper);
- top-p keeps every token for which the top-k-kept mass with a strictly larger key is < top_p of the
  top-k-kept total (the smallest such set, with ties at its boundary kept);
- min-p keeps every token whose weight exp(logit / T - max) is >= min_p: its probability is >= min_p times the
  top token's, whatever the normalisation (transformers' MinPLogitsWarper, applied after top-k and top-p there:
  each of the three keeps a prefix of the same logit order, so the kept set is the intersection);
- the token is the first one, in vocabulary order, whose running sum of kept weights exceeds u * total.
Both thresholds are found by a radix search over the keys, 4 bits per pass (16 bins of counts or masses; counts
by Triton's histogram, masses by a compare per bin; a chunk with nothing under the level's prefix is skipped), and
each row is cut into chunks so that a pass fills the GPU: a row costs a few passes over its logits instead of a
[V] sort (Llama-3, 256 rows: 3.7 ms with torch.sort, see benchmarks/RESULTS.md). A row's token depends on its
logits, parameters and u only: every reduction runs in a fixed order.

Two paths. Full (top-p or min-p without top-k, or a k above TOPK_PATH_MAX): the chunk max, 4 (16-bit keys) or
8 (fp32) count levels for top-k, as many weight levels for top-p, the kept weight per chunk, the draw: up to
2 + 2 x 8 passes over the row. Top-k (every row has a top_k <= TOPK_PATH_MAX, the usual 20-100): the candidates
are the tokens whose top 16 key bits are >= the 16-bit radix prefix of the k-th largest key (the top-k-kept
tokens plus the few tied with the k-th in those bits), found without a count level per 4 bits
(kernels/sample_topk.py): the chunk max of those 16 bits, per chunk the counts of 16 log2 bins of the distance
to the row's max (for a row where those bins are too coarse, a gated pass counting 256 sub-bins of the last
one), one pass appending the keys of the smallest window of bins that holds k to a per-row buffer, then one
program per row finds the prefix on that buffer, compacts the candidates and does the exact top-k, top-p, min-p
and the draw on them: 3 passes over the row and a row program, no weight histogram, no max pass.
Processed rows (logit_bias, penalties, bans: kernels/penalties.py) pass a ProcessPlan, and no fp32 [rows, V]
processed copy is written and read back: every pass computes the processed logit from the model's logits, the
row's token counts and its bias / ban entries at every load (kernels/penalties.process_block). (A first pass
listing per chunk the processed logits whose bits differ from the raw ones, patched into the raw loads of the
later passes, measured slower on an H200: 810 against 669 us for every field at 256 x 128k.)
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.penalties import ProcessPlan
from multilora_cli.kernels.sample_row import _digit, _histogram, _kept_sum, _key16, _load, _pick, _row_max
from multilora_cli.kernels.sample_topk import (
    _distance_hist,
    _draw_row,
    _in_window,
    _max_key16,
    _refined,
    _sub_hist,
    _window,
)

LOG2E = 1.4426950408889634
CHUNK = 8192  # logits per program: a 128k vocabulary x 256 rows is 4096 programs, 8 blocks of 1024 each
TOPK_PATH_MAX = 1024  # the top-k path's largest k
CANDIDATES = 2048  # the top-k path's buffer per row (KC): one size for every launch, so a row's draw never depends
# on its batch's largest k (the buffer's reductions run in an order set by its size); 2 x the largest k
WIDE = 4  # the top-k path's wide buffer per row (the window's keys), in candidate buffers: 8192 entries


@triton.jit
def _resolve(part_ptr, S, C, i, nlvl, need, CB: tl.constexpr):
    """Radix levels 0..nlvl-1 of a row from its chunks' partial histograms part[lvl, i, :C, :16] -> the key
    prefix: at each level the largest digit d with (weight above the prefix's range) + (weight of digits >= d)
    >= need. After every level: the largest key x with weight over {key >= x} >= need."""
    bins = tl.arange(0, 16)
    cs = tl.arange(0, CB)
    prefix = tl.zeros((), tl.int64)
    above = tl.zeros((), tl.float32)
    for lvl in range(nlvl):
        ptrs = part_ptr + ((lvl * S + i) * C + cs[:, None]) * 16 + bins[None, :]
        hist = tl.sum(tl.load(ptrs, mask=cs[:, None] < C, other=0.0), axis=0)  # [16], chunks in a fixed order
        prefix, above = _digit(hist, prefix, above, need)
    return prefix


@triton.jit
def _level0_total(part_ptr, C, i, CB: tl.constexpr):
    """The row's weight over all its level-0 bins: the top-k-kept total, from part[0, i, :C, :16]."""
    cs = tl.arange(0, CB)
    ptrs = part_ptr + (i * C + cs[:, None]) * 16 + tl.arange(0, 16)[None, :]
    return tl.sum(tl.sum(tl.load(ptrs, mask=cs[:, None] < C, other=0.0), axis=1), axis=0)


@triton.jit
def _threshold(
    part_k_ptr, part_p_ptr, S, C, i, V, top_k, top_p, WITH_P: tl.constexpr, KEY_BITS: tl.constexpr, CB: tl.constexpr
):
    """The smallest kept key: top-k's (0 when off), then top-p's above it (if WITH_P and on)."""
    tau = tl.zeros((), tl.int64)
    if top_k < V:
        tau = _resolve(part_k_ptr, S, C, i, KEY_BITS // 4, top_k.to(tl.float32), CB)
    if WITH_P:
        if top_p < 1.0:
            tau = _resolve(part_p_ptr, S, C, i, KEY_BITS // 4, top_p * _level0_total(part_p_ptr, C, i, CB), CB)
    return tau


@triton.jit
def _chunk_live(part_ptr, S, C, i, c, level, prefix):
    """Whether chunk c of row i has weight (or count) under `prefix` at `level`: its bin of the prefix's last digit
    one level up is > 0. A chunk with none would histogram to zeros, so skipping it changes no bit; under the
    narrow prefixes of the later levels most chunks of a peaked row have none."""
    up = tl.maximum(level - 1, 0)
    v = tl.load(part_ptr + ((up * S + i) * C + c) * 16 + (prefix & 15))
    return (level == 0) | (v > 0)


# Specialised on what is fixed for a run (the logits' dtype, address and row stride, V, the chunking, the token
# counts table), not on what varies from step to step: the row count S, the per-row parameter tensors and
# scratch slices (views at offsets set by the batch), the bias / ban tables' widths. Otherwise a step compiled
# a variant the precompile's dry run (engine/precompile.py) could not foresee: 19 compiles inside the demo's
# steps on an H200. The per-row loads are scalars and the scratch reads a few [C, 16] tiles: alignment buys
# nothing there.
_PER_STEP_POINTERS = [
    "rows_ptr", "temp_ptr", "top_k_ptr", "top_p_ptr", "min_p_ptr", "u_ptr", "out_ptr", "pmax_ptr", "psum_ptr",
    "part_k_ptr", "part_p_ptr", "wval_ptr", "wtok_ptr", "plan_rows_ptr", "hist_ptr", "rep_ptr", "freq_ptr", "pres_ptr", "ban_on_ptr",
]  # fmt: skip


@triton.jit(
    do_not_specialize=["LEVEL", "H", "S", "stride_bias", "stride_ban"],
    do_not_specialize_on_alignment=_PER_STEP_POINTERS,
)
def _sample_pass(
    logits_ptr,
    rows_ptr,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    u_ptr,
    out_ptr,
    pmax_ptr,
    psum_ptr,
    part_k_ptr,
    part_p_ptr,
    cval_ptr,
    ctok_ptr,
    wval_ptr,
    wtok_ptr,
    plan_rows_ptr,
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
    stride_row,
    S,
    C,
    LEVEL,
    MODE: tl.constexpr,
    WITH_MIN_P: tl.constexpr,
    PROCESS: tl.constexpr,
    WITH_COUNTS: tl.constexpr,
    KEY_BITS: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    CB: tl.constexpr,
    KC: tl.constexpr,
    WIDE: tl.constexpr,
    TT: tl.constexpr,
    KS: tl.constexpr,
    TS: tl.constexpr,
    NINF16: tl.constexpr,
    PACKED: tl.constexpr,
):
    """One pass over chunk c of row i. MODE 0: chunk max of logits / T. 1: counts per digit at radix level LEVEL
    (top-k). 2: kept weight per digit at LEVEL (top-p). 3: kept weight (min-p applied from here on: it cuts
    by weight alone, so the top-p passes before it see the top-k-kept mass, as in transformers). 4: the draw, by
    the chunk holding it. The top-k path (kernels/sample_topk.py): 8: the chunk's max key16 (top 16 key bits),
    9: its distance counts, 7: for a row whose window overflows the wide buffer, its sub-bin counts of the
    window's last bin (part_p: [S, C, 256] on this path), 5: its keys in the row's window appended to the row's
    wide buffer, 6 (one program a row): the prefix, the candidates and the draw from them (_finish), or _serial
    for a row with more than KC.
    Processed rows: PROCESS 1 processes every load."""
    MB: tl.constexpr = min(BLOCK, 256)
    i = tl.program_id(0)
    c = tl.program_id(1)
    r = tl.load(rows_ptr + i)  # the out row; with PROCESS the plan row, whose logits row is plan_rows[r]
    lr = r
    if PROCESS:
        lr = tl.load(plan_rows_ptr + r)
    row = logits_ptr + lr * stride_row
    lo = c * CHUNK
    hi = tl.minimum(lo + CHUNK, V)
    ic = i * C + c
    P = (
        hist_ptr, counts_ptr, rep_ptr, freq_ptr, pres_ptr, ban_on_ptr, bias_tok_ptr, bias_val_ptr, bias_len_ptr,
        ban_tok_ptr, ban_len_ptr, stride_counts, stride_bias, stride_ban, H,
    )  # fmt: skip
    inv_t = 1.0 / tl.load(temp_ptr + i)
    top_k = tl.load(top_k_ptr + i)
    top_p = tl.load(top_p_ptr + i)
    min_p = 0.0
    if WITH_MIN_P:
        min_p = tl.load(min_p_ptr + i)
    cs = tl.arange(0, CB)
    shift = KEY_BITS - 4 - 4 * LEVEL
    if MODE == 0:
        tl.store(pmax_ptr + i * C + c, _row_max(row, lo, hi, inv_t, r, P, PROCESS, WITH_COUNTS, BLOCK))
    elif MODE == 1:
        if top_k < V:  # the rows that filter by top-k (every row on the top-k path)
            prefix = _resolve(part_k_ptr, S, C, i, LEVEL, top_k.to(tl.float32), CB)
            hist = tl.zeros((16,), tl.float32)
            if _chunk_live(part_k_ptr, S, C, i, c, LEVEL, prefix):
                hist = _histogram(
                    row, lo, hi, prefix * 0, prefix, shift, 1.0, 0.0, r, P, False, PACKED, PROCESS, WITH_COUNTS,
                    KEY_BITS, BLOCK,
                )  # fmt: skip
            tl.store(part_k_ptr + ((LEVEL * S + i) * C + c) * 16 + tl.arange(0, 16), hist)
    elif MODE == 8:  # the top-k path: the chunk's max key16
        tl.store(pmax_ptr + ic, _max_key16(row, lo, hi, r, P, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK).to(tl.float32))
    elif MODE == 9:  # its keys' distance counts (to the row's max key16)
        m16 = tl.max(tl.load(pmax_ptr + i * C + cs, mask=cs < C, other=-1.0), axis=0).to(tl.int32)
        hist = _distance_hist(row, lo, hi, m16, r, P, PACKED, PROCESS, WITH_COUNTS, KEY_BITS, NINF16, BLOCK)
        tl.store(part_k_ptr + ic * 16 + tl.arange(0, 16), hist)
    elif MODE == 7:  # a row whose bins 0..j overflow the wide buffer: its bin j's sub-bin counts (part_p)
        j, cnt, at_j, _ = _window(part_k_ptr, C, i, top_k, CB)
        if tl.sum(cnt, axis=0) > WIDE:  # (the other rows exit here)
            m16 = tl.max(tl.load(pmax_ptr + i * C + cs, mask=cs < C, other=-1.0), axis=0).to(tl.int32)
            hist = tl.zeros((256,), tl.float32)
            if tl.sum(tl.where(cs == c, at_j, 0.0), axis=0) > 0:
                hist = _sub_hist(row, lo, hi, m16, j, r, P, PROCESS, WITH_COUNTS, KEY_BITS, NINF16, BLOCK)
            tl.store(part_p_ptr + ic * 256 + tl.arange(0, 256), hist)
    elif MODE == 5:  # its keys in the row's window, appended to the row's wide buffer
        m16 = tl.max(tl.load(pmax_ptr + i * C + cs, mask=cs < C, other=-1.0), axis=0).to(tl.int32)
        d_hi, cnt, _ = _refined(part_k_ptr, part_p_ptr, C, i, top_k, WIDE, CB)
        pos = tl.sum(tl.where(cs < c, cnt, 0.0), axis=0).to(tl.int32)  # this chunk's place in the row's buffer
        if (tl.sum(cnt, axis=0) <= WIDE) & (tl.sum(tl.where(cs == c, cnt, 0.0), axis=0) > 0):
            for start in range(lo, hi, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                ok = offs < hi
                x = _load(row, offs, ok, start, r, P, PROCESS, WITH_COUNTS, BLOCK)
                keep = ok & _in_window(_key16(x, KEY_BITS), m16, d_hi, NINF16)
                nk = tl.sum(keep.to(tl.int32), axis=0)
                if nk > 0:  # (most blocks hold none of the row's window: no scan, no store)
                    at = pos + tl.cumsum(keep.to(tl.int32), axis=0) - 1  # in vocabulary order
                    tl.store(wval_ptr + i * WIDE + at, x.to(tl.float32), mask=keep)
                    tl.store(wtok_ptr + i * WIDE + at, offs, mask=keep)
                pos += nk
    elif MODE == 6:
        tok = _draw_row(
            row, V, r, P, part_k_ptr, part_p_ptr, wval_ptr + i * WIDE, wtok_ptr + i * WIDE, cval_ptr + i * KC,
            ctok_ptr + i * KC, C, i, inv_t, top_k, top_p, min_p, tl.load(u_ptr + i), logits_ptr.dtype.element_ty,
            WITH_MIN_P, PROCESS, WITH_COUNTS, KEY_BITS, NINF16, CB, WIDE, KC, TT, KS, TS,
        )  # fmt: skip
        tl.store(out_ptr + r, tok.to(tl.int64))
    else:
        m = tl.max(tl.load(pmax_ptr + i * C + cs, mask=cs < C, other=float("-inf")), axis=0)
        if MODE == 2:
            if top_p < 1.0:
                floor = _threshold(part_k_ptr, part_p_ptr, S, C, i, V, top_k, top_p, False, KEY_BITS, CB)
                need = top_p * _level0_total(part_p_ptr, C, i, CB)  # (unused at level 0)
                prefix = _resolve(part_p_ptr, S, C, i, LEVEL, need, CB)
                hist = tl.zeros((16,), tl.float32)
                if _chunk_live(part_p_ptr, S, C, i, c, LEVEL, prefix):
                    # blocks of at most 256: the weights' [16, block] fp32 accumulator takes 16 x block / 128
                    # registers a thread (1024: 255 and spilled, 2 programs an SM; ptxas sm_90)
                    hist = _histogram(
                        row, lo, hi, floor, prefix, shift, inv_t, m, r, P, True, False, PROCESS, WITH_COUNTS,
                        KEY_BITS, MB,
                    )  # fmt: skip
                tl.store(part_p_ptr + ((LEVEL * S + i) * C + c) * 16 + tl.arange(0, 16), hist)
        elif MODE == 3:
            tau = _threshold(part_k_ptr, part_p_ptr, S, C, i, V, top_k, top_p, True, KEY_BITS, CB)
            kept = _kept_sum(row, lo, hi, tau, inv_t, m, min_p, r, P, WITH_MIN_P, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK)
            tl.store(psum_ptr + i * C + c, kept)
        else:
            # chunk c holds the draw if base_c <= target < end_c (ends: running sums of the chunks' kept weights
            # in chunk order); a target at or past the total (rounding) goes to the last non-empty chunk
            tau = _threshold(part_k_ptr, part_p_ptr, S, C, i, V, top_k, top_p, True, KEY_BITS, CB)
            parts = tl.load(psum_ptr + i * C + cs, mask=cs < C, other=0.0)
            ends = tl.cumsum(parts, axis=0)
            total = tl.max(ends, axis=0)
            end_c = tl.sum(tl.where(cs == c, ends, 0.0), axis=0)
            base_c = tl.sum(tl.where(cs == c - 1, ends, 0.0), axis=0)
            part_c = tl.sum(tl.where(cs == c, parts, 0.0), axis=0)
            last_c = tl.max(tl.where(parts > 0, cs, -1), axis=0)
            target = (tl.load(u_ptr + i) * total.to(tl.float64)).to(tl.float32)
            inside = (base_c <= target) & (target < end_c)
            if (part_c > 0) & (inside | ((c == last_c) & (target >= end_c))):
                tok = _pick(
                    row, lo, hi, tau, inv_t, m, min_p, base_c, target, r, P,
                    WITH_MIN_P, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK,
                )  # fmt: skip
                tl.store(out_ptr + r, tok.to(tl.int64))


def sample_rows(
    logits: torch.Tensor,
    rows: torch.Tensor,
    temp: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    u: torch.Tensor,
    out: torch.Tensor,
    *,
    min_p: torch.Tensor | None = None,
    plan: ProcessPlan | None = None,
    any_top_k: bool | None = None,
    any_top_p: bool | None = None,
    any_min_p: bool | None = None,
    max_top_k: int | None = None,
    chunk: int | None = None,
    topk_path_max: int = TOPK_PATH_MAX,
    candidates: int | None = None,
    block: int | None = None,
    num_warps: int = 4,
    packed_counts: bool = True,
    redraws: Iterable[tuple[torch.Tensor, torch.Tensor]] = (),
) -> None:
    """Draw one token for each row in `rows`; no sort, no host sync (given the any_* flags and max_top_k).

    logits: [N, V]  fp32 | fp16 | bf16, unit column stride
    rows:   [S]     int64, the rows of `logits` (and of `out`) to sample; with `plan`: rows of the plan
    temp:   [S]     fp32 > 0;  top_k: [S] int64 in [1, V] (V = off);  top_p: [S] fp32 in (0, 1] (1 = off)
    u:      [S]     fp64 in [0, 1), the row's one uniform draw
    out:    [N]     int64, written at `rows` only ([P] with `plan`)
    min_p:  [S]     fp32 in [0, 1] (0 = off), or None: off for every row
    plan:   kernels/penalties.ProcessPlan: row i draws from plan row rows[i]'s processed logits
            (process_rows(logits, plan)[rows[i]], fp32), computed inside every pass: no processed copy is written
    any_top_k / any_top_p / any_min_p: whether some row has top_k < V / top_p < 1 / min_p > 0; max_top_k: the
             largest top_k (V for a row without); None: read off the tensors, a sync
    topk_path_max: rows are drawn by the top-k path when every row has top_k < V and <= this (the Sampler calls
             once per path, each row by its own top_k: a row's path never depends on its batch); candidates: the
             path's buffer size per row (CANDIDATES; smaller only in tests)
    block, num_warps: logits a program takes per step (a power of two <= chunk; None: min(1024, chunk)) and its
             warps, for benchmarks/bench_sampler.py --sweep (the full path's weight levels hold [16, block] fp32)
    packed_counts: the count levels and the top-k path's distance counts count in packed registers instead of
             Triton's histogram (the same counts, kernels/sample_row._pack); on by default: H200, 256 x 128k, top-k 400 vs 420 us, top-k + top-p
             380 vs 427, every field on 726 vs 810 (bench_sampler --sweep, tokens identical)
    redraws: further (u, out) pairs drawn from the same rows after the first draw, each pair taken from the
             iterable only once the draw before it was launched (tests bisect on u this way without running the
             filter passes again); the serving path passes none

        for i, r in enumerate(rows):
            x = logits[r] (or processed);  s = x / temp[i];  w = exp(s - max(s));  key = order_keys(x)
            kept = key >= (k-th largest key)                                   # top_k[i] < V
            kept &= [sum(w[kept & (key > key[t])]) < top_p[i] * sum(w[kept]) for t]   # top_p[i] < 1
            kept &= w >= min_p[i]                                               # min_p[i] > 0
            out[r] = first t in vocabulary order with cumsum(w * kept)[t] > u[i] * sum(w * kept)

    Each row is cut into chunks of `chunk` logits (a program each), a pass is a launch over all (row, chunk).
    Full path: the chunk max, then per radix level (KEY_BITS / 4 of them) a 16-bin histogram per chunk, counts for
    top-k and weights for top-p, each program reducing the earlier levels' partial histograms itself (fixed
    order: the draw is deterministic), then the kept weight per chunk, then the draw in the chunk that holds it.
    Top-k path (every row has top_k < V, <= topk_path_max): per chunk the max of the top 16 key bits (key16),
    then per chunk 16 counts of log2 bins of the distance to the row's max, then (a pass launched always, working
    only for the rows whose window of bins holds more than the wide buffer: the others exit after reading their
    counts) per chunk 256 linear sub-bin counts of the window's last bin, then each chunk appends its keys in
    the smallest window of bins (and sub-bins) that holds k to the row's wide buffer (4 x candidates) in
    vocabulary order, then one program per row finds the 16-bit radix prefix of the k-th key on that buffer (on
    the whole row where even the refined window overflowed it), compacts the candidates (key16 >= prefix: every
    top-k-kept token, a few ties more) and draws from them (exact top-k, top-p, min-p): 3 passes over the logits
    (4 for rows whose window needed the sub-bins) and a row program instead of up to 2 + 2 x KEY_BITS / 4 + 2:

        MODE 8 (row, chunk) -> MODE 9 (row, chunk) -> MODE 7 (row, chunk; gated per row) -> MODE 5 (row, chunk)
        -> MODE 6 (row)   # 5 launches every call (CUDA-graph safe, no host sync)

    With `plan`, every pass processes the logits as it loads them.
    """
    if logits.stride(-1) != 1 or logits.dim() != 2:
        raise ValueError(f"sample_rows: logits must be [N, V] with unit last stride, got {tuple(logits.shape)}")
    s = rows.numel()
    if s == 0:
        return
    v = logits.shape[1]
    if any_top_k is None:
        any_top_k = bool((top_k < v).any())
    if any_top_p is None:
        any_top_p = bool((top_p < 1.0).any())
    if any_min_p is None:
        any_min_p = min_p is not None and bool((min_p > 0.0).any())
    if max_top_k is None:
        max_top_k = int(top_k.max())
    if min_p is None:
        min_p = top_p  # not read: WITH_MIN_P is off
    # processed logits are fp32: 32-bit keys
    bits = 32 if logits.dtype == torch.float32 or plan is not None else 16
    chunk = chunk or min(CHUNK, triton.next_power_of_2(v))
    block = min(block or 1024, chunk)
    c = triton.cdiv(v, chunk)
    topk_path = max_top_k < v and max_top_k <= topk_path_max  # every row filters by a small top-k
    kc = (candidates or CANDIDATES) if topk_path else 1
    any_p = any_top_p and not topk_path
    hist = s * c * 16 * (bits // 4)
    # the candidates first: their buffer (read in [KC] blocks) starts at the allocation, 16-byte aligned
    cand = s * kc
    # part_p: the top-p levels' weights on the full path; the sub-bin counts [S, C, 256] on the top-k path
    sub = s * c * 256 * topk_path
    scratch = torch.empty(cand + 2 * s * c + hist * (any_top_k or topk_path) + hist * any_p + sub, device=logits.device)
    cval = scratch[:cand]
    pmax, psum = scratch[cand : cand + s * c], scratch[cand + s * c : cand + 2 * s * c]
    at = cand + 2 * s * c
    part_k = scratch[at : at + hist] if any_top_k or topk_path else scratch
    part_p = scratch[at + hist * (any_top_k or topk_path) :] if any_p or topk_path else scratch
    ninf16 = _ninf16(torch.float32 if plan is not None else logits.dtype)
    ctok = torch.empty(s * kc if topk_path else 1, dtype=torch.int32, device=logits.device)
    wide = WIDE * kc if topk_path else 1
    wbuf = torch.empty(2 * s * wide, dtype=torch.int32, device=logits.device)  # per row: the window's logits, ids
    wval, wtok = wbuf[: s * wide].view(torch.float32), wbuf[s * wide :]
    if topk_path:
        passes = [(8, 0), (9, 0), (7, 0), (5, 0), (6, 0)]
    else:
        passes = (
            [(0, 0)]
            + [(1, lvl) for lvl in range(bits // 4) if any_top_k]
            + [(2, lvl) for lvl in range(bits // 4) if any_top_p]
            + [(3, 0), (4, 0)]
        )
    proc = [plan.rows, *plan.kernel_args()] if plan is not None else [_unused(logits.device)] * 12 + [0, 0, 0, 0]

    # (built once: a call launches up to 19 passes, and each launch's Python work is host time per step)
    head = [logits, rows, temp, top_k, top_p, min_p]
    tail = [
        pmax,
        psum,
        part_k,
        part_p,
        cval,
        ctok,
        wval,
        wtok,
        *proc[:12],
        *proc[12:],
        v,
        logits.stride(0),
        s,
        c,
    ]
    consts = dict(
        WITH_MIN_P=bool(any_min_p),
        PROCESS=int(plan is not None),
        WITH_COUNTS=plan is not None and bool(plan.num_history),
        KEY_BITS=bits,
        CHUNK=chunk,
        BLOCK=block,
        CB=triton.next_power_of_2(c),
        KC=kc,
        WIDE=wide,
        TT=max(1, min(kc, 8192 // kc)),
        KS=max(1, kc // 8),
        TS=max(1, min(kc // 8, 8192 // max(1, kc // 8))),
        NINF16=ninf16,
        PACKED=packed_counts and chunk // block <= 255,
        # 4 warps beat 8 in every pass (H200, 256 x 128k: top-p 853 -> 652 us, top-k 468 -> 414): ALU-bound
        # passes, more programs per SM
        num_warps=num_warps,
    )

    def run(mode: int, lvl: int, u: torch.Tensor, out: torch.Tensor) -> None:
        launch(_sample_pass, (s, 1 if mode == 6 else c), *head, u, out, *tail, lvl, MODE=mode, **consts)

    for mode, lvl in passes:
        run(mode, lvl, u, out)
    for u_again, out_again in redraws:  # the draw pass only reads the filter passes' scratch
        run(passes[-1][0], 0, u_again, out_again)


@functools.cache
def _unused(device: torch.device) -> torch.Tensor:
    """The plan's pointers of a launch without a plan (never read): one tensor per device, so such launches share
    a variant whatever their rows tensor."""
    return torch.zeros(1, dtype=torch.int64, device=device)


@functools.cache
def _ninf16(dtype: torch.dtype) -> int:
    """The top 16 bits of -inf's key in `dtype` (the keys' dtype: processed logits are fp32)."""
    bits = 32 if dtype == torch.float32 else 16
    return int(order_keys(torch.full((1, 1), float("-inf"), dtype=dtype))) >> (bits - 16)


# --- the same semantics in torch: the CPU path and the tests' reference --------------------------------------
def order_keys(logits: torch.Tensor) -> torch.Tensor:
    """int64 keys whose order is the logits' float order, from their storage bits: [R, V]."""
    if logits.dtype == torch.float32:
        b = logits.view(torch.int32).to(torch.int64)
        return torch.where(b < 0, b ^ 0x7FFFFFFF, b) + 2147483648
    b = logits.view(torch.int16).to(torch.int64)
    return torch.where(b < 0, b ^ 0x7FFF, b) + 32768


def kept_weights(
    logits: torch.Tensor,
    temp: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """exp(logits / T - max) where kept by top-k, top-p and min-p, else 0: [R, V] fp32 (unnormalised)."""
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
    keep = key >= tau_p
    if min_p is not None:
        keep &= w >= min_p.unsqueeze(1)
    return torch.where(keep, w, 0.0)


def sample_rows_torch(
    logits: torch.Tensor,
    temp: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    u: torch.Tensor,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """`sample_rows` for every row of `logits` (its rows argument = all rows), in torch ops: ids [R]."""
    w = kept_weights(logits, temp, top_k, top_p, min_p)
    cum = w.cumsum(dim=-1)
    target = (u * cum[:, -1].double()).float().unsqueeze(1)
    hit = (cum > target) & (w > 0)
    v = logits.shape[1]
    pos = torch.arange(v, device=logits.device)
    pick = torch.where(hit, pos, v).min(dim=-1).values
    last = torch.where(w > 0, pos, -1).max(dim=-1).values
    return torch.where(pick == v, last, pick)
