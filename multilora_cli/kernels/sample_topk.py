"""The sampling kernel's top-k path (kernels/sample.py): four passes over a row (a fifth, flag-gated, for rows
whose window is too wide) instead of a radix level per 4 key bits. Keys here are the top 16 bits of the order
keys (key16; the logits' own bits for bf16 / fp16).

    MODE 8, per chunk:  m[c] = max key16                                          (one read, no histogram)
    MODE 9, per chunk:  hist[c, b] = #{key16 in bin b}, M = max_c m[c] (the row's), bins of the distance to M:
                          b = floor(log2(M - key16 + 2)) - 1, at most 14, for key16 > NINF16 (above -inf's);
                          b = 15 for key16 == NINF16; keys below it (negative NaNs) in none
                        j = the smallest bin <= 14 with #{bins 0..j} >= k (14 if none): bins 0..j hold at least
                          k keys where the row has k above -inf
    MODE 7, per chunk:  only for a row whose bins 0..j hold more than WIDE keys (the others read their counts
                          and exit): sub[c, s] = #{keys of bin j in sub-bin s}, 256 linear sub-bins of bin j's
                          distances (one key16 each up to j = 7, 2^(j-7) above); the window becomes bins 0..j-1
                          plus sub-bins 0..s of bin j, s the smallest with >= k keys in it (`_refined`)
    MODE 5, per chunk:  the window's keys (key16 > NINF16, M - key16 < its distance bound) appended to the row's
                          wide buffer (WIDE entries) in vocabulary order, unless the window overflows it
    MODE 6, per row:    p = the largest x with #{key16 >= x} >= k (the radix search's 16-bit prefix), found on
                          the buffer; the candidates key16 >= p (> p when p is -inf's: a row with fewer than k
                          finite logits) compacted to the candidate buffer; `_finish` draws from them

The window is a key16 range from the top holding at least k keys, so it holds every key >= the k-th's key16 and
the candidates are those of the 4-level radix search over the row (every top-k-kept token, plus those that tie
with the k-th in key16), in the same order: the draw is the same bits. Bins 0..j are coarse far below the top:
with a few tokens far above the rest (a trained model's logits, N(0, 2) plus 20 raised by 12-20), the 50th key
lies in the bulk and bin j holds tens of thousands of keys; MODE 7 narrows it to about k. A row whose refined
window still overflows the wide buffer (thousands of ties, or 2^(j-7) key16s a sub-bin, near the k-th) finds p
with the radix levels over its whole row in the row program (`_row_prefix`), and a row with more than KC
candidates is drawn by `_serial`, the whole definition level after level over its row by one program; neither
happens on a usual row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from multilora_cli.kernels.sample_row import (
    _digit,
    _histogram,
    _kept_sum,
    _key16,
    _keys,
    _load,
    _pack,
    _pick,
    _row_max,
    _unpack,
    _weights,
)


@triton.jit
def _max_key16(row, lo, hi, r, P, PROCESS: tl.constexpr, WITH_COUNTS: tl.constexpr, KEY_BITS: tl.constexpr,
               BLOCK: tl.constexpr):  # fmt: skip
    """MODE 8: max key16 over [lo, hi), int32."""
    mx = tl.full((), -1, tl.int32)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < hi
        raw = _load(row, offs, ok, start, r, P, PROCESS, WITH_COUNTS, BLOCK)
        mx = tl.maximum(mx, tl.max(tl.where(ok, _key16(raw, KEY_BITS), -1), axis=0))
    return mx


@triton.jit
def _distance_hist(
    row,
    lo,
    hi,
    m16,
    r,
    P,
    PACKED: tl.constexpr,
    PROCESS: tl.constexpr,
    WITH_COUNTS: tl.constexpr,
    KEY_BITS: tl.constexpr,
    NINF16: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """MODE 9: [16] fp32 counts of [lo, hi)'s keys per distance bin to the row's max key16 m16 (module
    docstring). floor(log2(y)) of the integer y = m16 - key16 + 2 in [2, 2^16 + 1] is its fp32 exponent (exact).
    The counts as the count levels take them: packed registers (PACKED) or Triton's histogram."""
    counts = tl.zeros((16,), tl.int32)
    lo8 = tl.zeros((BLOCK,), tl.uint64)
    hi8 = tl.zeros((BLOCK,), tl.uint64)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < hi
        k16 = _key16(_load(row, offs, ok, start, r, P, PROCESS, WITH_COUNTS, BLOCK), KEY_BITS)
        y = tl.maximum(m16 - k16 + 2, 2).to(tl.float32)  # (>= 2 where ok: m16 is the max)
        b = tl.minimum((y.to(tl.int32, bitcast=True) >> 23) - 128, 14)
        b = tl.where(k16 == NINF16, 15, b)
        ok = ok & (k16 >= NINF16)
        if PACKED:
            lo8, hi8 = _pack(lo8, hi8, b, ok)
        else:
            counts += tl.histogram(b, 16, mask=ok)
    if PACKED:
        return _unpack(lo8, hi8)
    return counts.to(tl.float32)


@triton.jit
def _window(part_ptr, C, i, top_k, CB: tl.constexpr):
    """The row's window from its chunks' distance counts part[i, :C, :16]: (j, [CB] fp32 keys per chunk in bins
    0..j, [CB] in bin j, the row's count of key16 == NINF16). j: the smallest bin <= 14 whose bins 0..j hold
    >= top_k keys, else 14 (every key above -inf's)."""
    bins = tl.arange(0, 16)
    cs = tl.arange(0, CB)
    h = tl.load(part_ptr + (i * C + cs[:, None]) * 16 + bins[None, :], mask=cs[:, None] < C, other=0.0)
    tot = tl.sum(h, axis=0)  # [16], chunks in a fixed order (integers: any order is exact)
    cum = tl.cumsum(tl.where(bins < 15, tot, 0.0), axis=0)
    j = tl.min(tl.where((cum >= top_k.to(tl.float32)) & (bins < 15), bins, 14), axis=0)
    cnt = tl.sum(tl.where(bins[None, :] <= j, h, 0.0), axis=1)
    at_j = tl.sum(tl.where(bins[None, :] == j, h, 0.0), axis=1)
    return j, cnt, at_j, tl.sum(tl.where(bins == 15, tot, 0.0), axis=0)


@triton.jit
def _sub_bin(d, j):
    """Bin j's distances d = M - key16 in [2^(j+1) - 2, 2^(j+2) - 2) -> their sub-bin, int32 in [0, 256):
    (d - 2^(j+1) + 2) >> max(j - 7, 0), one distance a sub-bin up to j = 7 (bin 14 holds 2^15 distances: 128 a
    sub-bin)."""
    return tl.minimum(tl.maximum(d - ((2 << j) - 2), 0) >> tl.maximum(j - 7, 0), 255)


@triton.jit
def _sub_hist(row, lo, hi, m16, j, r, P, PROCESS: tl.constexpr, WITH_COUNTS: tl.constexpr, KEY_BITS: tl.constexpr,
              NINF16: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """MODE 7: [256] fp32 counts of [lo, hi)'s keys in distance bin j (above -inf's) per sub-bin (_sub_bin)."""
    counts = tl.zeros((256,), tl.int32)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < hi
        k16 = _key16(_load(row, offs, ok, start, r, P, PROCESS, WITH_COUNTS, BLOCK), KEY_BITS)
        d = m16 - k16
        ok = ok & (k16 > NINF16) & (d >= (2 << j) - 2) & (d < (4 << j) - 2)
        counts += tl.histogram(_sub_bin(d, j), 256, mask=ok)
    return counts.to(tl.float32)


@triton.jit
def _refined(part_ptr, sub_ptr, C, i, top_k, WIDE: tl.constexpr, CB: tl.constexpr):
    """The row's window, refined where bins 0..j overflow the wide buffer: (d_hi, [CB] fp32 keys per chunk in the
    window, the row's count of key16 == NINF16). The window is key16 > NINF16 and M - key16 < d_hi. Unrefined:
    d_hi = 2^(j+2) - 2 (bins 0..j). Refined (more than WIDE keys in bins 0..j; sub[i, :C, :256]: MODE 7's sub-bin
    counts of bin j): bins 0..j-1 and bin j's sub-bins 0..s, s the smallest with the window holding >= top_k
    keys; it still holds every key whose key16 is >= the k-th key's, so MODE 6's prefix is the same."""
    j, cnt, at_j, n_ninf = _window(part_ptr, C, i, top_k, CB)
    d_hi = (4 << j) - 2
    if tl.sum(cnt, axis=0) > WIDE:
        # a chunk's [256] at a time, as [16, 16] by radix digits of 255 - sub-bin: s by two _digit levels, then
        # masked loads of sub-bins 0..s. (MODE 5 at 80 / 72 registers raw / processed, as without the
        # refinement; a [256] cumsum took it to 88 / 96, the [C, 256] tile to 96 / 96; ptxas sm_90)
        dig = tl.arange(0, 16)
        at = 255 - (dig[:, None] * 16 + dig[None, :])  # [16, 16] the sub-bin of digits (hi, lo)
        tot = tl.zeros((16, 16), tl.float32)
        for cc in range(0, C):
            tot += tl.load(sub_ptr + (i * C + cc) * 256 + at)
        below = cnt - at_j  # [CB] keys in bins 0..j-1 (integers: exact)
        need = top_k.to(tl.float32) - tl.sum(below, axis=0)  # (> 0: bins 0..j-1 hold fewer than top_k)
        hi_d, above = _digit(tl.sum(tot, axis=1), tl.zeros((), tl.int32), tl.zeros((), tl.float32), need)
        d, _ = _digit(tl.sum(tl.where(dig[:, None] == hi_d, tot, 0.0), axis=0), hi_d, above, need)
        s = 255 - d  # the smallest sub-bin with #{sub-bins 0..s} >= need (255: bin j holds fewer)
        cs = tl.arange(0, CB)
        cnt = below
        sb = tl.arange(0, 256)
        for cc in range(0, C):  # (masked loads: the sub-bins 0..s only)
            cnt += tl.where(cs == cc, tl.sum(tl.load(sub_ptr + (i * C + cc) * 256 + sb, mask=sb <= s, other=0.0)), 0.0)
        d_hi = tl.minimum((2 << j) - 2 + ((s + 1) << tl.maximum(j - 7, 0)), d_hi)  # (s = 255: all of bin j)
    return d_hi, cnt, n_ninf


@triton.jit
def _in_window(k16, m16, d_hi, NINF16: tl.constexpr):
    """Whether key16 is in the window of distance bound d_hi (_refined): above -inf's and m16 - key16 < d_hi."""
    return (k16 > NINF16) & (m16 - k16 < d_hi)


@triton.jit
def _buf_key16(x, DT: tl.constexpr, KEY_BITS: tl.constexpr):
    """key16 of a buffered fp32 logit: as the passes computed it from the logit in its own dtype DT (fp32 holds
    a 16-bit float exactly, so the round trip is exact)."""
    if KEY_BITS == 16:
        return _keys(x.to(DT), 16)
    else:
        return _key16(x, 32)


@triton.jit
def _buffer_prefix(val, n, top_k, DT: tl.constexpr, KEY_BITS: tl.constexpr, BLOCK: tl.constexpr):
    """The largest 16-bit x with #{key16 >= x} >= top_k among the n buffered logits (n >= top_k): the 4 radix
    levels over the buffer, 16 bins a level."""
    prefix = tl.zeros((), tl.int32)
    above = tl.zeros((), tl.float32)
    for lvl in tl.static_range(4):
        shift = 12 - 4 * lvl
        counts = tl.zeros((16,), tl.int32)
        for start in range(0, n, BLOCK):
            idx = start + tl.arange(0, BLOCK)
            ok = idx < n
            k16 = _buf_key16(tl.load(val + idx, mask=ok, other=0.0), DT, KEY_BITS)
            ok = ok & ((k16 >> (shift + 4)) == prefix)
            counts += tl.histogram((k16 >> shift) & 15, 16, mask=ok)
        prefix, above = _digit(counts.to(tl.float32), prefix, above, top_k.to(tl.float32))
    return prefix


@triton.jit
def _row_prefix(
    row, V, top_k, r, P, PROCESS: tl.constexpr, WITH_COUNTS: tl.constexpr, KEY_BITS: tl.constexpr, BLOCK: tl.constexpr
):
    """The same prefix from the radix levels over the whole row, by one program (a row whose window overflows
    the wide buffer)."""
    prefix = tl.zeros((), tl.int32)
    above = tl.zeros((), tl.float32)
    for lvl in tl.static_range(4):
        h = _histogram(
            row, 0, V, prefix * 0, prefix, KEY_BITS - 4 - 4 * lvl, 1.0, 0.0, r, P, False, False, PROCESS, WITH_COUNTS,
            KEY_BITS, BLOCK,
        )  # fmt: skip
        prefix, above = _digit(h, prefix, above, top_k.to(tl.float32))
    return prefix


@triton.jit
def _compact_buffer(val, tok, n, low, cval, ctok, DT: tl.constexpr, KEY_BITS: tl.constexpr, KC: tl.constexpr,
                    BLOCK: tl.constexpr):  # fmt: skip
    """The buffered logits with key16 >= low -> cval / ctok[:KC], in buffer (vocabulary) order: their count."""
    pos = tl.zeros((), tl.int32)
    for start in range(0, n, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        ok = idx < n
        x = tl.load(val + idx, mask=ok, other=0.0)
        keep = ok & (_buf_key16(x, DT, KEY_BITS) >= low)
        at = pos + tl.cumsum(keep.to(tl.int32), axis=0) - 1
        tl.store(cval + at, x, mask=keep & (at < KC))
        tl.store(ctok + at, tl.load(tok + idx, mask=ok, other=0), mask=keep & (at < KC))
        pos += tl.sum(keep.to(tl.int32), axis=0)
    return pos


@triton.jit
def _compact_row(row, V, low, r, P, cval, ctok, PROCESS: tl.constexpr, WITH_COUNTS: tl.constexpr,
                 KEY_BITS: tl.constexpr, KC: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """The row's logits with key16 >= low -> cval / ctok[:KC], in vocabulary order: their count."""
    pos = tl.zeros((), tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < V
        x = _load(row, offs, ok, start, r, P, PROCESS, WITH_COUNTS, BLOCK)
        keep = ok & (_key16(x, KEY_BITS) >= low)
        at = pos + tl.cumsum(keep.to(tl.int32), axis=0) - 1
        tl.store(cval + at, x.to(tl.float32), mask=keep & (at < KC))
        tl.store(ctok + at, offs, mask=keep & (at < KC))
        pos += tl.sum(keep.to(tl.int32), axis=0)
    return pos


@triton.jit
def _draw_row(
    row,
    V,
    r,
    P,
    part,
    sub,
    wval,
    wtok,
    cval,
    ctok,
    C,
    i,
    inv_t,
    top_k,
    top_p,
    min_p,
    u,
    DT: tl.constexpr,
    WITH_MIN_P: tl.constexpr,
    PROCESS: tl.constexpr,
    WITH_COUNTS: tl.constexpr,
    KEY_BITS: tl.constexpr,
    NINF16: tl.constexpr,
    CB: tl.constexpr,
    WIDE: tl.constexpr,
    KC: tl.constexpr,
    TT: tl.constexpr,
    KS: tl.constexpr,
    TS: tl.constexpr,
):
    """MODE 6, one program for row i: the prefix p, the candidates compacted into cval / ctok[:KC] (this row's),
    the draw (module docstring). part / sub / wval / wtok: the row's distance counts, sub-bin counts and wide
    buffer. DT: the logits'
    dtype (the buffered keys' own). Its loops take 256 logits at a time: at BLOCK (1024) the processed row
    program spilled (ptxas, sm_90, Triton 3.6)."""
    _, cnt, n_ninf = _refined(part, sub, C, i, top_k, WIDE, CB)
    n_w = tl.sum(cnt, axis=0)
    if (n_w <= WIDE) & (n_w + n_ninf >= top_k.to(tl.float32)):
        p = tl.full((), NINF16, tl.int32)  # fewer than k above -inf's, at least k with them: p is -inf's
        if n_w >= top_k.to(tl.float32):
            p = _buffer_prefix(wval, n_w.to(tl.int32), top_k, DT, KEY_BITS, 256)
        low = p + (p == NINF16).to(tl.int32)
        n = _compact_buffer(wval, wtok, n_w.to(tl.int32), low, cval, ctok, DT, KEY_BITS, KC, 256)
    else:
        p = _row_prefix(row, V, top_k, r, P, PROCESS, WITH_COUNTS, KEY_BITS, 256)
        low = p + (p == NINF16).to(tl.int32)
        n = _compact_row(row, V, low, r, P, cval, ctok, PROCESS, WITH_COUNTS, KEY_BITS, KC, 256)
    tl.debug_barrier()  # (the candidates this program's threads stored, read back by all of them)
    if n <= KS:
        # the usual row (k 20-100, a few ties): the same draw on a KS-sized view of its buffer, 8x fewer
        # compares and shorter reductions than at KC; which size a row takes depends on its own n only
        tok = _finish(cval, ctok, n, inv_t, top_k, top_p, min_p, u, WITH_MIN_P, KS, TS)
    elif n <= KC:
        tok = _finish(cval, ctok, n, inv_t, top_k, top_p, min_p, u, WITH_MIN_P, KC, TT)
    else:
        # blocks of 256: its weight histogram's [16, block] accumulator would take 128 registers a thread at
        # 1024 and spill the buffer's draw above (ptxas, sm_90, processed rows)
        tok = _serial(row, V, r, P, inv_t, top_k, top_p, min_p, u, WITH_MIN_P, PROCESS, WITH_COUNTS, KEY_BITS, 256)
    return tok


@triton.jit
def _finish(cval, ctok, n, inv_t, top_k, top_p, min_p, u, WITH_MIN_P: tl.constexpr, KC: tl.constexpr, TT: tl.constexpr):
    """The draw from a row's n <= KC candidates (cval: their logits, fp32, ctok: their ids, in vocabulary order;
    every top-k-kept token is among them): the exact top-k (k-th largest key), top-p within its survivors, min-p,
    the inverse-CDF draw. Ranks and masses above a key are compare-and-sum over all pairs, TT candidates at a
    time (n x KC compares). KC (the buffer, kernels/sample.CANDIDATES, or its first eighth when n fits there) is
    set by the launch's buffer and the row's own n, so a row's sums run in the same order whatever its batch."""
    idx = tl.arange(0, KC)
    valid = idx < n
    x = tl.load(cval + idx, mask=valid, other=float("-inf"))
    key = tl.where(valid, _keys(x, 32).to(tl.int64), -1)  # [KC] int64; -1 below every real key
    m = tl.max(tl.where(valid, x * inv_t, float("-inf")), axis=0)
    w = tl.where(valid, _weights(x, inv_t, m), 0.0)
    tau_k = tl.zeros((), tl.int64)
    for t0 in range(0, n, TT):  # tau_k = the largest key with >= k keys at or above it
        tt = t0 + tl.arange(0, TT)
        kt = tl.where(tt < n, _keys(tl.load(cval + tt, mask=tt < n, other=0.0), 32).to(tl.int64), -1)
        ge = tl.sum((key[None, :] >= kt[:, None]).to(tl.int32), axis=1)
        tau_k = tl.maximum(tau_k, tl.max(tl.where((tt < n) & (ge >= top_k), kt, 0), axis=0))
    wk = tl.where(key >= tau_k, w, 0.0)
    tau = tau_k
    if top_p < 1.0:  # the smallest kept key whose strictly larger kept mass is < top_p of the kept total
        need = top_p * tl.sum(wk, axis=0)
        tau_p = tl.full((), 9223372036854775807, tl.int64)
        for t0 in range(0, n, TT):
            tt = t0 + tl.arange(0, TT)
            kt = tl.where(tt < n, _keys(tl.load(cval + tt, mask=tt < n, other=0.0), 32).to(tl.int64), -1)
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
            h = _histogram(
                row, 0, V, tau * 0, tau, shift, inv_t, m, r, P, False, False, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK
            )
            tau, above = _digit(h, tau, above, top_k.to(tl.float32))
    if top_p < 1.0:
        total = _kept_sum(row, 0, V, tau, inv_t, m, 0.0, r, P, False, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK)
        tau_p = tl.zeros((), tl.int64)
        above = tl.zeros((), tl.float32)
        for lvl in range(KEY_BITS // 4):
            shift = KEY_BITS - 4 - 4 * lvl
            h = _histogram(
                row, 0, V, tau, tau_p, shift, inv_t, m, r, P, True, False, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK
            )
            tau_p, above = _digit(h, tau_p, above, top_p * total)
        tau = tl.maximum(tau, tau_p)
    total = _kept_sum(row, 0, V, tau, inv_t, m, min_p, r, P, WITH_MIN_P, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK)
    target = (u * total.to(tl.float64)).to(tl.float32)
    return _pick(
        row, 0, V, tau, inv_t, m, min_p, total * 0.0, target, r, P, WITH_MIN_P, PROCESS, WITH_COUNTS, KEY_BITS, BLOCK
    )
