"""The sampling kernel's top-k path (kernels/sample.py): per row, the candidates whose top 16 key bits are >= the
4-level radix prefix (every top-k-kept token and the few that tie with the k-th one in those bits) sit in a
buffer in vocabulary order; one program draws from them (`_finish`: exact top-k, top-p on the survivors, min-p,
inverse CDF). A row with more candidates than the buffer holds (thousands of ties) is drawn by `_serial`, the
whole definition level after level over its row by one program."""

from __future__ import annotations

import triton
import triton.language as tl

from multilora_cli.kernels.sample_row import _digit, _histogram, _kept_sum, _keys, _pick, _row_max, _weights


@triton.jit
def _chunk_counts(part_ptr, S, C, i, prefix, incl, CB: tl.constexpr):
    """[CB] f32: per chunk of row i, how many of its keys have their top 16 bits > prefix (a 4-level prefix), or
    >= it where `incl`, read off the 4 levels' count histograms part[lvl, i, :C, :16] (digits above the prefix's
    at each level, plus the prefix's own bin at the last where incl)."""
    bins = tl.arange(0, 16)
    cs = tl.arange(0, CB)
    cnt = tl.zeros((CB,), tl.float32)
    for lvl in tl.static_range(4):
        d = (prefix >> (12 - 4 * lvl)) & 15
        h = tl.load(part_ptr + ((lvl * S + i) * C + cs[:, None]) * 16 + bins[None, :], mask=cs[:, None] < C, other=0.0)
        if lvl == 3:
            sel = (bins > d) | ((bins == d) & incl)
        else:
            sel = bins > d
        cnt += tl.sum(tl.where(sel[None, :], h, 0.0), axis=1)
    return cnt


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
