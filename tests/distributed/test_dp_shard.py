"""Adapter-affinity sharding: balanced tokens, each adapter on the fewest workers, hot adapters split only when
they alone would unbalance the run; and the first pass that feeds it (scan_costs)."""

from __future__ import annotations

import json
import math
import random

import pytest

from multilora_cli.distributed.scan import BYTES_PER_TOKEN, scan_costs
from multilora_cli.distributed.shard import BASE, affinity_shard, round_robin_shard, shard, summarize


def skewed(seed: int, n_adapters: int = 10, base: int = 0):
    """Zipf-like request counts over `n_adapters` (the first is hot), random costs, shuffled input order."""
    rng = random.Random(seed)
    counts = [int(400 / (k + 1) ** 1.2) + 5 for k in range(n_adapters)]
    rows = [(a, rng.randint(20, 300)) for a, c in enumerate(counts) for _ in range(c)]
    rows += [(BASE, rng.randint(20, 300)) for _ in range(base)]
    rng.shuffle(rows)
    return [a for a, _ in rows], [t for _, t in rows]


def weights(adapters, tokens):
    w: dict[int, int] = {}
    for a, t in zip(adapters, tokens):
        if a != BASE:
            w[a] = w.get(a, 0) + t
    return w


@pytest.mark.parametrize("base", [0, 300])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("world", range(2, 9))
def test_skewed_adapters_balanced_and_on_fewest_workers(world, seed, base):
    ads, toks = skewed(seed, base=base)
    assign = affinity_shard(ads, toks, world)
    s = summarize(assign, ads, toks, world)
    mean = sum(toks) / world
    assert max(s.tokens) <= 1.10 * mean and min(s.tokens) >= 0.90 * mean, s.tokens
    w = weights(ads, toks)
    # An adapter must span at least ceil(W / max load) workers; the greedy may add one cut per worker boundary
    # at most (W - 1 in all), and never more than one extra for any adapter.
    lower = {a: math.ceil(w[a] / max(s.tokens)) for a in w}
    assert all(s.spans[a] <= lower[a] + 1 for a in w), (s.spans, lower)
    assert sum(s.spans[a] - lower[a] for a in w) <= world - 1
    target = sum(toks) / world
    assert all(s.spans[a] <= math.ceil(w[a] / target) + 1 for a in w)  # a small adapter: 2 workers at most
    rr = summarize(round_robin_shard(len(ads), world), ads, toks, world)
    assert sum(s.adapters) < sum(rr.adapters) and max(s.adapters) < max(rr.adapters)


def test_adapters_that_pack_exactly_are_never_split():
    ads = [a for a in range(6) for _ in range(10)]  # 6 adapters x 10 requests x 50 tokens over 3 workers
    assign = affinity_shard(ads, [50] * len(ads), 3)
    s = summarize(assign, ads, [50] * len(ads), 3)
    assert s.tokens == [1000, 1000, 1000] and s.adapters == [2, 2, 2]
    assert set(s.spans.values()) == {1}


def test_hot_adapter_split_into_the_fewest_pieces_in_input_order():
    # adapter 0 holds 70% of the tokens over 4 workers: 2.8 workers' worth -> exactly 3 workers
    ads = [0] * 70 + [a for a in range(1, 7) for _ in range(5)]
    toks = [10] * 100
    assign = affinity_shard(ads, toks, 4)
    s = summarize(assign, ads, toks, 4)
    assert s.spans == {0: 3, **{a: 1 for a in range(1, 7)}} and s.tokens == [250] * 4
    hot = [assign[i] for i in range(70)]
    assert hot == sorted(hot, key=hot.index)  # each piece is a run of consecutive requests (input order kept)


def test_equal_adapters_that_cannot_pack_whole_are_cut_at_most_once_each():
    # 5 adapters of 0.8 worker-shares over 4 workers: LPT would cut the fifth into 4 slivers; the sequential
    # packing cuts 3 adapters once each, which is what the guarantee asks for
    ads = [a for a in range(5) for _ in range(40)]
    toks = [10] * len(ads)
    s = summarize(affinity_shard(ads, toks, 4), ads, toks, 4)
    assert s.tokens == [500] * 4 and max(s.spans.values()) == 2 and sum(s.spans.values()) == 8


def test_base_requests_fill_the_gaps():
    ads = [0] * 30 + [1] * 10 + [BASE] * 40
    toks = [10] * 80
    s = summarize(affinity_shard(ads, toks, 2), ads, toks, 2)
    assert s.tokens == [400, 400] and s.spans == {0: 1, 1: 1}


@pytest.mark.parametrize(
    "ads, toks, world", [([], [], 4), ([0, 1], [5, 5], 1), ([0], [7], 8), ([BASE] * 5, [1, 2, 3, 4, 5], 2)]
)
def test_edges(ads, toks, world):
    assign = affinity_shard(ads, toks, world)
    assert len(assign) == len(ads) and all(0 <= w < world for w in assign)
    if ads and world > 1 and all(a == BASE for a in ads):
        assert sorted(summarize(assign, ads, toks, world).tokens) == [7, 8]


def test_round_robin_and_dispatch():
    assert round_robin_shard(5, 2) == [0, 1, 0, 1, 0]
    assert shard([0, 0, 0], [1, 1, 1], 3, "round-robin") == [0, 1, 2]
    with pytest.raises(ValueError, match="unknown sharding"):
        shard([0], [1], 2, "random")


def test_scan_costs_reads_adapters_and_estimates(tmp_path):
    rows = [
        {"id": 1, "prompt": "x" * 40, "adapter": "legal", "max_tokens": 5},
        {"id": 2, "messages": [{"role": "user", "content": "y" * 32}], "adapter": "base"},
        "not json",
        {"id": 4, "prompt": "z" * 8, "adapter": "nope", "max_tokens": 3},
        {"id": 5, "prompt": "w", "adapter": "medical", "max_tokens": "bad"},
        {"id": 6, "prompt": "v" * 4, "adapter": "legal"},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n\n")
    known = {"legal", "medical"}
    costs = scan_costs(str(path), 1, lambda a: a if a in known else None, 16)
    assert costs.start_key == 1 and len(costs) == 5  # key 0 was kept by --resume: not scanned
    assert costs.names == ["medical", "legal"]
    assert list(costs.adapters) == [BASE, BASE, BASE, 0, 1]  # base alias, bad line, unknown adapter -> base
    assert list(costs.tokens) == [(32 + 8) // BYTES_PER_TOKEN + 16, 16, 8 // BYTES_PER_TOKEN + 3, 0 + 16, 1 + 16]
