"""Slot-cache arithmetic: tenant popularity, LRU hit rate for `max_loras` GPU slots, distinct adapters per step.

Model: the independent reference model (IRM): each newly admitted request names tenant i with probability p_i,
independently. Under IRM an LRU cache of C items has, by the Che approximation, a characteristic time T with
sum_i (1 - exp(-p_i T)) = C and per-item hit probability 1 - exp(-p_i T); the overall hit rate is
sum_i p_i (1 - exp(-p_i T)). For uniform popularity LRU's hit rate is exactly C / N (every cache state of
C distinct items is equally likely), which Che also gives.
"""

from __future__ import annotations

import numpy as np

POPULARITIES = ("uniform", "zipf")


def popularity(tenants: int, kind: str = "uniform", s: float = 1.0) -> np.ndarray:
    """Request share of each tenant, most popular first: uniform 1/N, or zipf p_i ∝ i^-s (i = 1..N)."""
    if kind == "uniform" or s == 0:
        return np.full(tenants, 1.0 / tenants)
    if kind != "zipf":
        raise ValueError(kind)
    w = np.arange(1, tenants + 1, dtype=np.float64) ** -float(s)
    return w / w.sum()


def lru_hit_rate(p: np.ndarray, slots: int) -> float:
    """Steady-state LRU hit rate of `slots` slots under IRM with popularity `p` (exact if uniform, else Che)."""
    n = np.count_nonzero(p)  # a steep zipf underflows the tail to 0: those tenants are never asked for
    if slots >= n:
        return 1.0  # every tenant stays resident after its first load
    if np.all(p == p[0]):
        return slots / n
    target = float(slots)

    def occupancy(t: float) -> float:  # expected distinct items referenced within time t
        return float(np.sum(-np.expm1(-p * t)))

    lo, hi = 0.0, 1.0
    while occupancy(hi) < target:  # occupancy grows from 0 to n > slots, so this stops
        if hi > 1e300:  # the slots' last tenants are asked for so rarely that T overflows: every request hits
            return float(np.sum(p * -np.expm1(-p * hi)))
        hi *= 2.0
    for _ in range(200):  # bisection to machine precision (monotone in t)
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if occupancy(mid) < target else (lo, mid)
        if hi - lo <= 1e-12 * hi:
            break
    t = 0.5 * (lo + hi)
    return float(np.sum(p * -np.expm1(-p * t)))


def expected_distinct(p: np.ndarray, draws: float) -> float:
    """Expected number of distinct tenants among `draws` independent requests: sum_i 1 - (1 - p_i)^draws."""
    if draws <= 0:
        return 0.0
    return float(np.sum(-np.expm1(draws * np.log1p(-np.minimum(p, 1 - 1e-15)))))
