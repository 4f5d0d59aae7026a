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
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch
from multilora_cli.kernels.penalties import ProcessPlan, process_block

LOG2E = 1.4426950408889634
CHUNK = 8192  # logits per program: a 128k vocabulary x 256 rows is 4096 programs, 8 blocks of 1024 each
TOPK_PATH_MAX = 1024  # the top-k path's largest k: its per-row draw compares all pairs of <= 2,048 candidates


@triton.jit
def _keys(raw, KEY_BITS: tl.constexpr):
    """Logits (their storage dtype) -> keys in [0, 2^KEY_BITS) ordered as the floats (-0 before +0): int32 for
    16-bit logits (int64 arithmetic costs two instructions per op), int64 for fp32."""
    if KEY_BITS == 16:
        b = raw.to(tl.int16, bitcast=True).to(tl.int32)
        b = tl.where(b < 0, b ^ 0x7FFF, b)
        return b + 32768
    else:
        b = raw.to(tl.int32, bitcast=True)
        b = tl.where(b < 0, b ^ 0x7FFFFFFF, b)
        return b.to(tl.int64) + 2147483648


@triton.jit
def _as_key(x, KEY_BITS: tl.constexpr):
    """A key-valued int64 scalar in the keys' own type (so comparisons with them stay 32-bit where they can)."""
    if KEY_BITS == 16:
        return x.to(tl.int32)
    else:
        return x


@triton.jit
def _weights(raw, inv_t, m):
    """exp(logit / T - m), the same expression in every pass (so every pass sees the same bits)."""
    return tl.exp2((raw.to(tl.float32) * inv_t - m) * 1.4426950408889634)


@triton.jit
def _load(row, offs, ok, start, r, P, PROCESS: tl.constexpr, WITH_COUNTS: tl.constexpr, BLOCK: tl.constexpr):
    """The logits of `row` at offs = start + arange(BLOCK) (0 where not ok): as stored, or, when PROCESS, plan row
    r's processed logits in fp32 (kernels/penalties.process_block, P its plan's pointers), computed here in every
    pass instead of being written to an fp32 [rows, V] copy first."""
    if PROCESS:
        x = process_block(
            row, offs, ok, start, r, P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], P[8], P[9], P[10], P[11],
            P[12], P[13], P[14], WITH_COUNTS, BLOCK,
        )  # fmt: skip
    else:
        x = tl.load(row + offs, mask=ok, other=0.0)
    return x


@triton.jit
def _digit(hist, prefix, above, need):
    """One radix level: the largest digit d with above + (weight of digits >= d) >= need -> (prefix * 16 + d,
    above + weight of digits > d)."""
    bins = tl.arange(0, 16)
    suffix = tl.sum(tl.where(bins[None, :] >= bins[:, None], hist[None, :], 0.0), axis=1)
    d = tl.maximum(tl.max(tl.where(above + suffix >= need, bins, -1), axis=0), 0)
    return prefix * 16 + d, above + tl.sum(tl.where(bins > d, hist, 0.0), axis=0)


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
def _histogram(
    row,
    lo,
    hi,
    floor,
    prefix,
    shift,
    inv_t,
    m,
    r,
    P,
    MASS: tl.constexpr,
    PROCESS: tl.constexpr,
    WITH_COUNTS: tl.constexpr,
    KEY_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """[16]: per digit (key >> shift) & 15 of the keys >= floor under `prefix`, their count or weight."""
    bins = tl.arange(0, 16)
    floor = _as_key(floor, KEY_BITS)
    prefix = _as_key(prefix, KEY_BITS)
    # [16, BLOCK], reduced once at the end: the block axis is the loads' layout (no shuffle of digit or w), the
    # 16 bins repeat in each thread's registers. [BLOCK, 16] put the bins across threads: top-k over 256 rows
    # of 128k took 2.7 ms instead of 0.8 ms on an H200 (a [16] reduction per block and int64 keys: 4.5 ms)
    acc = tl.zeros((16, BLOCK), tl.float32)
    counts = tl.zeros((16,), tl.int32)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < hi
        raw = _load(row, offs, ok, start, r, P, PROCESS, WITH_COUNTS, BLOCK)
        key = _keys(raw, KEY_BITS)
        ok = ok & (key >= floor) & ((key >> (shift + 4)) == prefix)
        digit = ((key >> shift) & 15).to(tl.int32)
        if MASS:
            w = tl.where(ok, _weights(raw, inv_t, m), 0.0)
            acc += tl.where(bins[:, None] == digit[None, :], w[None, :], 0.0)
        else:
            # counts: Triton's warp-vote histogram, ~2x faster than the compare per bin (H200, 256 x 128k:
            # 64-80 vs 150-155 us a pass); integers, so exact
            counts += tl.histogram(digit, 16, mask=ok)
    if MASS:
        return tl.sum(acc, axis=1)
    return counts.to(tl.float32)


@triton.jit
def _chunk_live(part_ptr, S, C, i, c, level, prefix):
    """Whether chunk c of row i has weight (or count) under `prefix` at `level`: its bin of the prefix's last digit
    one level up is > 0. A chunk with none would histogram to zeros, so skipping it changes no bit; under the
    narrow prefixes of the later levels most chunks of a peaked row have none."""
    up = tl.maximum(level - 1, 0)
    v = tl.load(part_ptr + ((up * S + i) * C + c) * 16 + (prefix & 15))
    return (level == 0) | (v > 0)


@triton.jit
def _kept(raw, ok, tau, inv_t, m, min_p, WITH_MIN_P: tl.constexpr, KEY_BITS: tl.constexpr):
    """The weights of the kept tokens (top-k and top-p: key >= tau; min-p: weight >= min_p), else 0."""
    w = _weights(raw, inv_t, m)
    keep = ok & (_keys(raw, KEY_BITS) >= tau)
    if WITH_MIN_P:
        keep = keep & (w >= min_p)
    return tl.where(keep, w, 0.0)


@triton.jit
def _row_max(row, lo, hi, inv_t, r, P, PROCESS: tl.constexpr, WITH_COUNTS: tl.constexpr, BLOCK: tl.constexpr):
    """max(logit / T) over [lo, hi)."""
    mx = tl.full((), float("-inf"), tl.float32)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < hi
        raw = _load(row, offs, ok, start, r, P, PROCESS, WITH_COUNTS, BLOCK)
        mx = tl.maximum(mx, tl.max(tl.where(ok, raw.to(tl.float32) * inv_t, float("-inf")), axis=0))
    return mx


@triton.jit
def _kept_sum(
    row,
    lo,
    hi,
    tau,
    inv_t,
    m,
    min_p,
    r,
    P,
    WITH_MIN_P: tl.constexpr,
    PROCESS: tl.constexpr,
    WITH_COUNTS: tl.constexpr,
    KEY_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    tau = _as_key(tau, KEY_BITS)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < hi
        raw = _load(row, offs, ok, start, r, P, PROCESS, WITH_COUNTS, BLOCK)
        acc += _kept(raw, ok, tau, inv_t, m, min_p, WITH_MIN_P, KEY_BITS)
    return tl.sum(acc, axis=0)


@triton.jit
def _pick(
    row,
    lo,
    hi,
    tau,
    inv_t,
    m,
    min_p,
    run,
    target,
    r,
    P,
    WITH_MIN_P: tl.constexpr,
    PROCESS: tl.constexpr,
    WITH_COUNTS: tl.constexpr,
    KEY_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The first kept token of [lo, hi) where run + the running kept weight exceeds target, else the last one."""
    tau = _as_key(tau, KEY_BITS)
    pick = tl.full((), 2147483647, tl.int32)
    last = tl.full((), -1, tl.int32)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < hi
        raw = _load(row, offs, ok, start, r, P, PROCESS, WITH_COUNTS, BLOCK)
        w = _kept(raw, ok, tau, inv_t, m, min_p, WITH_MIN_P, KEY_BITS)
        hit = (w > 0) & (run + tl.cumsum(w, axis=0) > target)
        pick = tl.minimum(pick, tl.min(tl.where(hit, offs, 2147483647), axis=0))
        last = tl.maximum(last, tl.max(tl.where(w > 0, offs, -1), axis=0))
        run += tl.sum(w, axis=0)
    return tl.where(pick == 2147483647, last, pick)


# --- the top-k path: radix on the top 16 key bits, the candidates compacted, the rest on them -----------------
@triton.jit
def _chunk_counts(part_ptr, S, C, i, prefix, CB: tl.constexpr):
    """[CB] f32: per chunk of row i, how many of its keys have their top 16 bits >= prefix (a 4-level prefix),
    read off the 4 levels' count histograms part[lvl, i, :C, :16] (digits above the prefix's at each level, plus
    the prefix's own bin at the last)."""
    bins = tl.arange(0, 16)
    cs = tl.arange(0, CB)
    cnt = tl.zeros((CB,), tl.float32)
    for lvl in tl.static_range(4):
        d = (prefix >> (12 - 4 * lvl)) & 15
        h = tl.load(part_ptr + ((lvl * S + i) * C + cs[:, None]) * 16 + bins[None, :], mask=cs[:, None] < C, other=0.0)
        if lvl == 3:
            sel = bins >= d
        else:
            sel = bins > d
        cnt += tl.sum(tl.where(sel[None, :], h, 0.0), axis=1)
    return cnt


@triton.jit
def _finish(cval, ctok, n, inv_t, top_k, top_p, min_p, u, WITH_MIN_P: tl.constexpr, KC: tl.constexpr, TT: tl.constexpr):
    """The draw from a row's n <= KC candidates (cval: their logits, fp32, ctok: their ids, in vocabulary order;
    every top-k-kept token is among them): the exact top-k (k-th largest key), top-p within its survivors, min-p,
    the inverse-CDF draw. Ranks and masses above a key are compare-and-sum over all pairs, TT candidates at a
    time (KC <= 2048: at most 4M compares, one program)."""
    idx = tl.arange(0, KC)
    valid = idx < n
    x = tl.load(cval + idx, mask=valid, other=float("-inf"))
    key = tl.where(valid, _keys(x, 32), -1)  # [KC] int64; -1 below every real key
    m = tl.max(tl.where(valid, x * inv_t, float("-inf")), axis=0)
    w = tl.where(valid, _weights(x, inv_t, m), 0.0)
    tau_k = tl.zeros((), tl.int64)
    for t0 in range(0, KC, TT):  # tau_k = the largest key with >= k keys at or above it
        tt = t0 + tl.arange(0, TT)
        kt = tl.where(tt < n, _keys(tl.load(cval + tt, mask=tt < n, other=0.0), 32), -1)
        ge = tl.sum((key[None, :] >= kt[:, None]).to(tl.int32), axis=1)
        tau_k = tl.maximum(tau_k, tl.max(tl.where((tt < n) & (ge >= top_k), kt, 0), axis=0))
    wk = tl.where(key >= tau_k, w, 0.0)
    tau = tau_k
    if top_p < 1.0:  # the smallest kept key whose strictly larger kept mass is < top_p of the kept total
        need = top_p * tl.sum(wk, axis=0)
        tau_p = tl.full((), 9223372036854775807, tl.int64)
        for t0 in range(0, KC, TT):
            tt = t0 + tl.arange(0, TT)
            kt = tl.where(tt < n, _keys(tl.load(cval + tt, mask=tt < n, other=0.0), 32), -1)
            above = tl.sum(tl.where(key[None, :] > kt[:, None], wk[None, :], 0.0), axis=1)
            ok = (tt < n) & (kt >= tau_k) & (above < need)
            tau_p = tl.minimum(tau_p, tl.min(tl.where(ok, kt, 9223372036854775807), axis=0))
        tau = tau_p
    keep = valid & (key >= tau)
    if WITH_MIN_P:
        keep = keep & (w >= min_p)
    wd = tl.where(keep, w, 0.0)
    target = (u * tl.sum(wd, axis=0).to(tl.float64)).to(tl.float32)
    hit = (wd > 0) & (tl.cumsum(wd, axis=0) > target)
    pick = tl.min(tl.where(hit, idx, KC), axis=0)
    pick = tl.where(pick == KC, tl.max(tl.where(wd > 0, idx, -1), axis=0), pick)
    return tl.sum(tl.where(idx == pick, tl.load(ctok + idx, mask=valid, other=0), 0), axis=0)


@triton.jit
def _serial(
    row,
    V,
    r,
    P,
    inv_t,
    top_k,
    top_p,
    min_p,
    u,
    WITH_MIN_P: tl.constexpr,
    PROCESS: tl.constexpr,
    WITH_COUNTS: tl.constexpr,
    KEY_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The whole definition for one row by one program, level after level over [0, V): for a row whose
    candidates overflow the buffer (thousands of ties at the k-th logit), never on a usual row."""
    m = _row_max(row, 0, V, inv_t, r, P, PROCESS, WITH_COUNTS, BLOCK)
    tau = tl.zeros((), tl.int64)
    if top_k < V:
        above = tl.zeros((), tl.float32)
        for lvl in range(KEY_BITS // 4):
            shift = KEY_BITS - 4 - 4 * lvl
            h = _histogram(row, 0, V, tau * 0, tau, shift, inv_t, m, r, P, False, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK)
            tau, above = _digit(h, tau, above, top_k.to(tl.float32))
    if top_p < 1.0:
        total = _kept_sum(row, 0, V, tau, inv_t, m, 0.0, r, P, False, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK)
        tau_p = tl.zeros((), tl.int64)
        above = tl.zeros((), tl.float32)
        for lvl in range(KEY_BITS // 4):
            shift = KEY_BITS - 4 - 4 * lvl
            h = _histogram(row, 0, V, tau, tau_p, shift, inv_t, m, r, P, True, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK)
            tau_p, above = _digit(h, tau_p, above, top_p * total)
        tau = tl.maximum(tau, tau_p)
    total = _kept_sum(row, 0, V, tau, inv_t, m, min_p, r, P, WITH_MIN_P, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK)
    target = (u * total.to(tl.float64)).to(tl.float32)
    return _pick(
        row, 0, V, tau, inv_t, m, min_p, total * 0.0, target, r, P, WITH_MIN_P, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK
    )


@triton.jit(do_not_specialize=["LEVEL", "H"])
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
    TT: tl.constexpr,
):
    """One pass over chunk c of row i. MODE 0: chunk max of logits / T. 1: counts per digit at radix level LEVEL
    (top-k). 2: kept weight per digit at LEVEL (top-p). 3: kept weight (min-p applied from here on: it cuts
    by weight alone, so the top-p passes before it see the top-k-kept mass, as in transformers). 4: the draw, by
    the chunk holding it. The top-k path: MODE 1 at levels 0-3 only, then 5: the chunk's candidates
    (top 16 key bits >= the 4-level prefix) appended to the row's buffer, 6 (one program a row): the draw from
    them (_finish), or _serial for a row with more than KC."""
    i = tl.program_id(0)
    c = tl.program_id(1)
    r = tl.load(rows_ptr + i)  # the out row; with PROCESS the plan row, whose logits row is plan_rows[r]
    lr = r
    if PROCESS:
        lr = tl.load(plan_rows_ptr + r)
    row = logits_ptr + lr * stride_row
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
    lo = c * CHUNK
    hi = tl.minimum(lo + CHUNK, V)
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
                    row, lo, hi, prefix * 0, prefix, shift, 1.0, 0.0, r, P, False, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK
                )
            tl.store(part_k_ptr + ((LEVEL * S + i) * C + c) * 16 + tl.arange(0, 16), hist)
    elif MODE == 5:
        prefix = _resolve(part_k_ptr, S, C, i, 4, top_k.to(tl.float32), CB)
        cnt = _chunk_counts(part_k_ptr, S, C, i, prefix, CB)
        pos = tl.sum(tl.where(cs < c, cnt, 0.0), axis=0).to(tl.int32)  # this chunk's place in the row's buffer
        if (tl.sum(cnt, axis=0) <= KC) & (tl.sum(tl.where(cs == c, cnt, 0.0), axis=0) > 0):
            low = _as_key(prefix << (KEY_BITS - 16), KEY_BITS)
            for start in range(lo, hi, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                ok = offs < hi
                x = _load(row, offs, ok, start, r, P, PROCESS, WITH_COUNTS, BLOCK)
                keep = ok & (_keys(x, KEY_BITS) >= low)
                at = pos + tl.cumsum(keep.to(tl.int32), axis=0) - 1  # in vocabulary order
                tl.store(cval_ptr + i * KC + at, x.to(tl.float32), mask=keep)
                tl.store(ctok_ptr + i * KC + at, offs, mask=keep)
                pos += tl.sum(keep.to(tl.int32), axis=0)
    elif MODE == 6:
        prefix = _resolve(part_k_ptr, S, C, i, 4, top_k.to(tl.float32), CB)
        n = tl.sum(_chunk_counts(part_k_ptr, S, C, i, prefix, CB), axis=0)
        u = tl.load(u_ptr + i)
        if n <= KC:
            tok = _finish(
                cval_ptr + i * KC, ctok_ptr + i * KC, n.to(tl.int32), inv_t, top_k, top_p, min_p, u, WITH_MIN_P, KC, TT
            )
        else:
            tok = _serial(
                row, V, r, P, inv_t, top_k, top_p, min_p, u, WITH_MIN_P, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK
            )
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
                    hist = _histogram(
                        row, lo, hi, floor, prefix, shift, inv_t, m, r, P, True, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK
                    )
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
    topk_path_max: rows are drawn by the top-k path when every row has top_k < V and <= this; candidates: its buffer
             size per row (default: 2 x the largest k, at least 256), smaller only in tests
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
    Top-k path (every row has top_k < V, <= topk_path_max): 4 count levels over the top 16 key bits, then each chunk
    appends its candidates (top 16 bits >= the 4-level prefix: every top-k-kept token, a few ties more) to the
    row's buffer in vocabulary order, then one program per row draws from the buffer (exact top-k, top-p,
    min-p): 5 passes over the logits instead of up to 2 + 2 x KEY_BITS / 4 + 2.
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
    block = min(1024, chunk)
    c = triton.cdiv(v, chunk)
    topk_path = max_top_k < v and max_top_k <= topk_path_max  # every row filters by a small top-k
    kc = (candidates or max(256, triton.next_power_of_2(2 * max_top_k))) if topk_path else 1
    any_p = any_top_p and not topk_path
    hist = s * c * 16 * (bits // 4)
    scratch = torch.empty(2 * s * c + hist * (any_top_k or topk_path) + hist * any_p + s * kc, device=logits.device)
    pmax, psum = scratch[: s * c], scratch[s * c : 2 * s * c]
    part_k = scratch[2 * s * c : 2 * s * c + hist] if any_top_k or topk_path else scratch
    part_p = scratch[2 * s * c + hist * (any_top_k or topk_path) :] if any_p else scratch
    cval = scratch[scratch.numel() - s * kc :]
    ctok = torch.empty(s * kc if topk_path else 1, dtype=torch.int32, device=logits.device)
    if topk_path:
        passes = [(1, lvl) for lvl in range(4)] + [(5, 0), (6, 0)]
    else:
        passes = (
            [(0, 0)]
            + [(1, lvl) for lvl in range(bits // 4) if any_top_k]
            + [(2, lvl) for lvl in range(bits // 4) if any_top_p]
            + [(3, 0), (4, 0)]
        )
    proc = [plan.rows, *plan.kernel_args()] if plan is not None else [rows] * 12 + [0, 0, 0, 0]

    def run(mode: int, lvl: int, u: torch.Tensor, out: torch.Tensor) -> None:
        launch(
            _sample_pass,
            (s, 1 if mode == 6 else c),
            logits,
            rows,
            temp,
            top_k,
            top_p,
            min_p,
            u,
            out,
            pmax,
            psum,
            part_k,
            part_p,
            cval,
            ctok,
            *proc,
            v,
            logits.stride(0),
            s,
            c,
            lvl,
            MODE=mode,
            WITH_MIN_P=bool(any_min_p),
            PROCESS=plan is not None,
            WITH_COUNTS=plan is not None and bool(plan.num_history),
            KEY_BITS=bits,
            CHUNK=chunk,
            BLOCK=block,
            # 4 warps beat 8 in every pass (H200, 256 x 128k: top-p 853 -> 652 us, top-k 468 -> 414): ALU-bound
            # passes, more programs per SM
            CB=triton.next_power_of_2(c),
            KC=kc,
            TT=max(1, min(kc, 8192 // kc)),
            num_warps=4,
        )

    for mode, lvl in passes:
        run(mode, lvl, u, out)
    for u_again, out_again in redraws:  # the draw pass only reads the filter passes' scratch
        run(passes[-1][0], 0, u_again, out_again)


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
