"""The sampling kernel's work over a range of one row (kernels/sample.py launches it): the order keys, the
weights exp(logit / T - max), the fused loads (processed logits when the row has a ProcessPlan), a radix level's
histogram, the kept weights and the inverse-CDF pick. Every pass calls the same expressions, so every pass sees
the same bits."""

from __future__ import annotations

import triton
import triton.language as tl

from multilora_cli.kernels.penalties import process_block


@triton.jit
def _keys(raw, KEY_BITS: tl.constexpr):
    """Logits (their storage dtype) -> keys in [0, 2^KEY_BITS) ordered as the floats (-0 before +0): int32 for
    16-bit logits, uint32 for fp32 (int64 arithmetic costs two instructions per op; b + 2^31 = b ^ 2^31 mod 2^32)."""
    if KEY_BITS == 16:
        b = raw.to(tl.int16, bitcast=True).to(tl.int32)
        b = tl.where(b < 0, b ^ 0x7FFF, b)
        return b + 32768
    else:
        b = raw.to(tl.int32, bitcast=True)
        b = tl.where(b < 0, b ^ 0x7FFFFFFF, b)
        return b.to(tl.uint32, bitcast=True) ^ 0x80000000


@triton.jit
def _key16(raw, KEY_BITS: tl.constexpr):
    """The keys' top 16 bits, int32 in [0, 2^16): the top-k path's search keys."""
    if KEY_BITS == 16:
        return _keys(raw, 16)
    else:
        return (_keys(raw, 32) >> 16).to(tl.int32)


@triton.jit
def _as_key(x, KEY_BITS: tl.constexpr):
    """A key-valued int64 scalar in the keys' own type (so comparisons with them stay 32-bit where they can)."""
    if KEY_BITS == 16:
        return x.to(tl.int32)
    else:
        return x.to(tl.uint32)


@triton.jit
def _weights(raw, inv_t, m):
    """exp(logit / T - m), the same expression in every pass (so every pass sees the same bits)."""
    return tl.exp2((raw.to(tl.float32) * inv_t - m) * 1.4426950408889634)


@triton.jit
def _load(row, offs, ok, start, r, P, PROCESS: tl.constexpr, WITH_COUNTS: tl.constexpr, BLOCK: tl.constexpr):
    """The logits of `row` at offs = start + arange(BLOCK) (0 where not ok): PROCESS 0: as stored; 1: plan row
    r's processed logits in fp32 (P: its plan's pointers), processed here (kernels/penalties.process_block): no
    fp32 [rows, V] copy."""
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
    PACKED: tl.constexpr,
    PROCESS: tl.constexpr,
    WITH_COUNTS: tl.constexpr,
    KEY_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """[16]: per digit (key >> shift) & 15 of the keys >= floor under `prefix`, their count or weight. Counts:
    Triton's histogram per block, or with PACKED (at most 255 blocks in [lo, hi)) 8-bit counters per register
    slot, 8 digits to a uint64, widened and summed once at the end: no shared-memory atomics, no barrier per
    block; integers either way, the same counts."""
    bins = tl.arange(0, 16)
    floor = _as_key(floor, KEY_BITS)
    prefix = _as_key(prefix, KEY_BITS)
    # [16, BLOCK], reduced once at the end: the block axis is the loads' layout (no shuffle of digit or w), the
    # 16 bins repeat in each thread's registers. [BLOCK, 16] put the bins across threads: top-k over 256 rows
    # of 128k took 2.7 ms instead of 0.8 ms on an H200 (a [16] reduction per block and int64 keys: 4.5 ms)
    acc = tl.zeros((16, BLOCK), tl.float32)
    counts = tl.zeros((16,), tl.int32)
    lo8 = tl.zeros((BLOCK,), tl.uint64)  # PACKED: byte d of slot j = how many of its keys had digit d (0-7)
    hi8 = tl.zeros((BLOCK,), tl.uint64)  # (digits 8-15)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < hi
        raw = _load(row, offs, ok, start, r, P, PROCESS, WITH_COUNTS, BLOCK)
        key = _keys(raw, KEY_BITS)
        top = key >> shift  # (then >> 4: one shift by shift + 4 = 32 would be undefined on 32-bit keys)
        ok = ok & (key >= floor) & ((top >> 4) == prefix)
        digit = (top & 15).to(tl.int32)
        if MASS:
            w = tl.where(ok, _weights(raw, inv_t, m), 0.0)
            acc += tl.where(bins[:, None] == digit[None, :], w[None, :], 0.0)
        elif PACKED:
            lo8, hi8 = _pack(lo8, hi8, digit, ok)
        else:
            # counts: Triton's warp-vote histogram, ~2x faster than the compare per bin (H200, 256 x 128k:
            # 64-80 vs 150-155 us a pass); integers, so exact
            counts += tl.histogram(digit, 16, mask=ok)
    if MASS:
        return tl.sum(acc, axis=1)
    if PACKED:
        return _unpack(lo8, hi8)
    return counts.to(tl.float32)


@triton.jit
def _pack(lo8, hi8, digit, ok):
    """Count each slot's key (where ok) in its digit's byte of the slot's packed counters: lo8 holds digits 0-7,
    hi8 8-15, a byte each ([BLOCK] uint64; at most 255 counts a slot)."""
    inc = ok.to(tl.uint64) << ((digit & 7) * 8).to(tl.uint64)
    return lo8 + tl.where(digit < 8, inc, 0), hi8 + tl.where(digit < 8, 0, inc)


@triton.jit
def _unpack(lo8, hi8):
    """[16] fp32: the packed counters' totals per digit. Bytes -> 16-bit fields (even bytes, odd bytes) before
    summing the slots: a digit's total is < 2^16."""
    bins = tl.arange(0, 16)
    m = 0x00FF00FF00FF00FF
    lo_e, lo_o = tl.sum(lo8 & m, axis=0), tl.sum((lo8 >> 8) & m, axis=0)
    hi_e, hi_o = tl.sum(hi8 & m, axis=0), tl.sum((hi8 >> 8) & m, axis=0)
    even = (bins & 1) == 0
    word = tl.where(bins < 8, tl.where(even, lo_e, lo_o), tl.where(even, hi_e, hi_o))
    return ((word >> (((bins & 7) // 2) * 16).to(tl.uint64)) & 0xFFFF).to(tl.float32)


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
