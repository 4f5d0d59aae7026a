"""Adapter-affinity sharding: split a run's requests over W workers so each adapter lands on as few workers as
possible while every worker gets about the same number of tokens.

Why: a worker pays for every distinct adapter it serves (slot loads, host cache, one A/B read per step per
adapter). Round-robin puts every adapter on every worker; affinity puts each adapter on one worker unless
the adapter alone is bigger than a worker's share, and lets base-model requests (no adapter) fill the gaps.

Algorithm (longest-processing-time first, with splitting):
  T = total tokens / W (the target), cap = T * (1 + tolerance).
  1. Adapters by weight, heaviest first: put the whole adapter on the least-loaded worker if that stays
     <= cap; otherwise cut it (in input order) into pieces that fill the least-loaded workers up to T each,
     keeping the tail whole once it fits under cap. Every cut fills a worker to T, so the run needs at most
     W - 1 cuts beyond those a hot adapter (weight > T) forces.
  2. Base requests, heaviest first, each to the least-loaded worker.
Items are single requests, so loads are exact up to one request's tokens.
"""

from __future__ import annotations

import heapq
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
        return {"estimated_tokens": self.tokens, "requests": self.requests, "adapters": self.adapters,
                "imbalance": round(self.imbalance, 4),
                "adapters_split": sum(1 for n in self.spans.values() if n > 1)}


def round_robin_shard(n: int, world: int) -> list[int]:
    """Request i -> worker i % world: the baseline that ignores adapters."""
    return [i % world for i in range(n)]


def affinity_shard(adapters: Sequence[int], tokens: Sequence[int], world: int,
                   tolerance: float = 0.05) -> list[int]:
    """Worker (0..world-1) of each request. `adapters[i]`: adapter index of request i (BASE = none);
    `tokens[i]`: its estimated cost (prompt + max new tokens). See the module docstring for the algorithm."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if len(adapters) != len(tokens):
        raise ValueError("adapters and tokens must have the same length")
    n = len(adapters)
    assign = [0] * n
    if world == 1 or n == 0:
        return assign
    groups: dict[int, list[int]] = {}
    for i, a in enumerate(adapters):
        groups.setdefault(a, []).append(i)
    free = groups.pop(BASE, [])
    weight = {a: sum(tokens[i] for i in idx) for a, idx in groups.items()}
    target = sum(max(t, 0) for t in tokens) / world
    cap = target * (1.0 + tolerance)
    heap = [(0, w) for w in range(world)]  # (load, worker): the least-loaded worker on top
    for a in sorted(groups, key=lambda a: (-weight[a], a)):
        _place_adapter(groups[a], tokens, weight[a], heap, assign, target, cap)
    for i in sorted(free, key=lambda i: (-tokens[i], i)):
        load, w = heapq.heappop(heap)
        assign[i] = w
        heapq.heappush(heap, (load + tokens[i], w))
    return assign


def _place_adapter(items: list[int], tokens: Sequence[int], remaining: int, heap: list, assign: list[int],
                   target: float, cap: float) -> None:
    """Place one adapter's requests (in input order) as few pieces as the loads allow."""
    start = 0
    while start < len(items):
        load, w = heapq.heappop(heap)
        if load + remaining <= cap:  # the rest fits: keep it whole
            for i in items[start:]:
                assign[i] = w
            heapq.heappush(heap, (load + remaining, w))
            return
        room = target - load
        taken = 0
        end = start
        while end < len(items) and (end == start or taken + tokens[items[end]] <= room):
            taken += tokens[items[end]]
            assign[items[end]] = w
            end += 1
        remaining -= taken
        start = end
        heapq.heappush(heap, (load + taken, w))


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
