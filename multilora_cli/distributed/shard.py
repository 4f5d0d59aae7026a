"""Adapter-affinity sharding: split a run's requests over W workers so each adapter lands on as few workers as
possible while every worker gets about the same number of tokens.

Why: a worker pays for every distinct adapter it serves (slot loads, host cache, one A/B read per step per
adapter). Round-robin puts every adapter on every worker; affinity puts each adapter on one worker unless
the adapter alone is bigger than a worker's share, and lets base-model requests (no adapter) fill the gaps.

T = total tokens / W (the target), cap = T * (1 + tolerance). Two packings:
  LPT (first choice; spreads adapters evenly over workers): adapters by weight, heaviest first, each whole
    on the least-loaded worker if that stays <= cap; otherwise cut in input order into pieces that fill the
    least-loaded workers to ~T, the last piece going whole to the tightest worker it fits under cap. Then
    base requests, heaviest first, each to the least-loaded worker.
  Sequential (fallback with a guarantee): adapters heaviest first, then base requests, laid end to end and cut
    at k*T, each cut moved to an adapter boundary when one is within tolerance*T. Every load is within
    2*tolerance*T (+ one request) of T, and an adapter of weight w spans at most ceil(w / T) + 1 workers.
The LPT result is kept when it meets the sequential guarantee, else the sequential one is used.
Items are single requests, so loads are exact up to one request's tokens.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

BASE = -1  # adapter index of a base-model request: it needs no adapter, any worker may take it
SHARDINGS = ("affinity", "round-robin")


@dataclass(slots=True)
class ShardSummary:
    """What a sharding did: per worker estimated tokens, requests and distinct adapters."""

    tokens: list[int]
    requests: list[int]
    adapters: list[int]  # distinct adapters per worker (base excluded)
    spans: dict[int, int] = field(default_factory=dict)  # adapter -> number of workers it landed on

    @property
    def imbalance(self) -> float:
        """max load / mean load - 1 (0 = perfect)."""
        mean = sum(self.tokens) / len(self.tokens) if self.tokens else 0
        return max(self.tokens) / mean - 1.0 if mean > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "estimated_tokens": self.tokens,
            "requests": self.requests,
            "adapters": self.adapters,
            "imbalance": round(self.imbalance, 4),
            "adapters_split": sum(1 for n in self.spans.values() if n > 1),
        }


def round_robin_shard(n: int, world: int) -> list[int]:
    """Request i -> worker i % world: the baseline that ignores adapters."""
    return [i % world for i in range(n)]


def affinity_shard(adapters: Sequence[int], tokens: Sequence[int], world: int, tolerance: float = 0.045) -> list[int]:
    """Worker (0..world-1) of each request. `adapters[i]`: adapter index of request i (BASE = none);
    `tokens[i]`: its estimated cost (prompt + max new tokens). See the module docstring for the algorithm."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if len(adapters) != len(tokens):
        raise ValueError("adapters and tokens must have the same length")
    if world == 1 or not adapters:
        return [0] * len(adapters)
    groups: dict[int, list[int]] = {}
    for i, a in enumerate(adapters):
        groups.setdefault(a, []).append(i)
    free = groups.pop(BASE, [])
    weight = {a: sum(tokens[i] for i in idx) for a, idx in groups.items()}
    order = sorted(groups, key=lambda a: (-weight[a], a))
    target = sum(tokens) / world
    assign = _lpt(groups, order, weight, free, tokens, world, target, target * (1.0 + tolerance))
    if not _guaranteed(assign, adapters, tokens, world, weight, target, tolerance):
        assign = _sequential(groups, order, free, tokens, world, target, tolerance)
    return assign


def _lpt(
    groups: dict[int, list[int]],
    order: list[int],
    weight: dict[int, int],
    free: list[int],
    tokens: Sequence[int],
    world: int,
    target: float,
    cap: float,
) -> list[int]:
    assign = [0] * len(tokens)
    load = [0] * world
    least = lambda: min(range(world), key=lambda w: (load[w], w))  # noqa: E731 - W is small
    for a in order:
        items, remaining, start = groups[a], weight[a], 0
        while start < len(items):
            w = least()
            if load[w] + remaining <= cap:  # the rest fits whole; a cut-off tail goes where it fits tightest
                if start > 0:
                    w = min(
                        (x for x in range(world) if load[x] + remaining <= cap),
                        key=lambda x: (cap - load[x] - remaining, x),
                    )
                for i in items[start:]:
                    assign[i] = w
                load[w] += remaining
                break
            room, taken, end = target - load[w], 0, start
            while end < len(items) and (end == start or taken + tokens[items[end]] // 2 <= room):
                taken += tokens[items[end]]  # to the request boundary nearest the target
                assign[items[end]] = w
                end += 1
            remaining -= taken
            load[w] += taken
            start = end
    for i in sorted(free, key=lambda i: (-tokens[i], i)):
        w = least()
        assign[i] = w
        load[w] += tokens[i]
    return assign


def _sequential(
    groups: dict[int, list[int]],
    order: list[int],
    free: list[int],
    tokens: Sequence[int],
    world: int,
    target: float,
    tolerance: float,
) -> list[int]:
    seq: list[int] = []  # request indices end to end
    cum: list[int] = []  # cum[j] = tokens of seq[:j + 1]
    ends: list[int] = [0]  # cumulative positions where a cut splits no adapter
    pos = 0
    for group in [groups[a] for a in order] + [[i] for i in sorted(free, key=lambda i: (-tokens[i], i))]:
        for i in group:
            seq.append(i)
            pos += tokens[i]
            cum.append(pos)
        ends.append(pos)
    cuts = [0]  # worker k takes seq[cuts[k]:cuts[k + 1]]
    for k in range(1, world):
        ideal = k * target
        j = bisect.bisect_left(ends, ideal)
        near = min((ends[x] for x in (j - 1, j) if 0 <= x < len(ends)), key=lambda b: abs(b - ideal))
        at = near if abs(near - ideal) <= tolerance * target else ideal
        r = bisect.bisect_left(cum, at)  # the request boundary nearest `at`: after r or r + 1 requests
        n = min((x for x in (r, r + 1) if x <= len(seq)), key=lambda x: abs((cum[x - 1] if x else 0) - at))
        cuts.append(max(n, cuts[-1]))
    cuts.append(len(seq))
    assign = [0] * len(tokens)
    for k in range(world):
        for i in seq[cuts[k] : cuts[k + 1]]:
            assign[i] = k
    return assign


def _guaranteed(
    assign: list[int],
    adapters: Sequence[int],
    tokens: Sequence[int],
    world: int,
    weight: dict[int, int],
    target: float,
    tolerance: float,
) -> bool:
    """Does `assign` meet the sequential packing's bounds (balance and span per adapter)?"""
    s = summarize(assign, adapters, tokens, world)
    slack = 2 * tolerance * target + max(tokens)
    if max(s.tokens) > target + slack or min(s.tokens) < target - slack:
        return False
    return all(s.spans[a] <= math.ceil(w / target) + 1 for a, w in weight.items())


def summarize(assign: Sequence[int], adapters: Sequence[int], tokens: Sequence[int], world: int) -> ShardSummary:
    """Per-worker estimated tokens, requests and distinct adapters of an assignment."""
    load = [0] * world
    reqs = [0] * world
    seen: list[set[int]] = [set() for _ in range(world)]
    for w, a, t in zip(assign, adapters, tokens):
        load[w] += t
        reqs[w] += 1
        if a != BASE:
            seen[w].add(a)
    spans: dict[int, int] = {}
    for s in seen:
        for a in s:
            spans[a] = spans.get(a, 0) + 1
    return ShardSummary(load, reqs, [len(s) for s in seen], spans)


def shard(adapters: Sequence[int], tokens: Sequence[int], world: int, how: str = "affinity") -> list[int]:
    """Dispatch on the sharding name ("affinity" | "round-robin")."""
    if how == "affinity":
        return affinity_shard(adapters, tokens, world)
    if how == "round-robin":
        return round_robin_shard(len(adapters), world)
    raise ValueError(f"unknown sharding {how!r}; choose one of {', '.join(SHARDINGS)}")
