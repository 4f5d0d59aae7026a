"""LRU slot arithmetic: exact uniform hit rate, Che for zipf (checked by simulation), monotonicity, thrash."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest

from multilora_cli.economics import Scenario, compute, expected_distinct, lru_hit_rate, popularity


def simulate_lru(p: np.ndarray, slots: int, refs: int, seed: int = 0) -> float:
    """Monte-Carlo LRU under the independent reference model; the first fifth is warm-up."""
    draws = np.random.default_rng(seed).choice(len(p), size=refs, p=p)
    cache: OrderedDict[int, None] = OrderedDict()
    hits, warm = 0, refs // 5
    for k, item in enumerate(draws):
        if item in cache:
            cache.move_to_end(item)
            hits += k >= warm
        else:
            cache[item] = None
            if len(cache) > slots:
                cache.popitem(last=False)
    return hits / (refs - warm)


def test_uniform_hit_rate_is_exact_and_matches_simulation():
    p = popularity(50, "uniform")
    assert lru_hit_rate(p, 8) == 8 / 50
    assert lru_hit_rate(p, 50) == lru_hit_rate(p, 80) == 1.0
    assert simulate_lru(p, 8, 40_000) == pytest.approx(8 / 50, abs=0.01)
    assert lru_hit_rate(popularity(50, "zipf", 0.0), 8) == 8 / 50  # zipf s=0 is uniform


@pytest.mark.parametrize("s,slots", [(0.8, 8), (1.2, 4), (1.0, 16)])
def test_che_approximation_tracks_simulated_lru(s, slots):
    p = popularity(60, "zipf", s)
    assert lru_hit_rate(p, slots) == pytest.approx(simulate_lru(p, slots, 60_000, seed=slots), abs=0.02)


def test_zipf_hit_rate_is_monotonic_in_slots_and_in_s():
    p = popularity(500, "zipf", 1.0)
    by_slots = [lru_hit_rate(p, c) for c in (1, 2, 4, 8, 16, 64, 256, 499)]
    assert all(a < b for a, b in zip(by_slots, by_slots[1:]))
    by_s = [lru_hit_rate(popularity(500, "zipf", s), 8) for s in (0.0, 0.5, 0.8, 1.0, 1.2, 2.0)]
    assert all(a < b for a, b in zip(by_s, by_s[1:]))
    assert by_s[0] == pytest.approx(8 / 500)


def test_expected_distinct_closed_form_for_uniform():
    n, b = 100, 44
    assert expected_distinct(popularity(n), b) == pytest.approx(n * (1 - (1 - 1 / n) ** b))
    assert expected_distinct(popularity(1), 10) == pytest.approx(1.0)
    assert expected_distinct(popularity(n, "zipf", 1.5), b) < expected_distinct(popularity(n), b)


def test_slot_section_by_hand():
    rep = compute(Scenario(tenants=100, model="llama-2-7b", max_loras=8, requests_per_step=4))
    sl, fl = rep.section("slots"), rep.section("fleet")
    replicas = fl["shared_gpus"]  # one GPU per replica here
    t = math.ceil(100 / replicas)
    assert sl["tenants_per_replica"] == t
    hit = 8 / t
    adapter = 32 * 2**20
    assert sl["hit_rate"] == pytest.approx(hit)
    assert sl["loads_per_step"] == pytest.approx(4 * (1 - hit))
    assert sl["load_bytes_per_step"] == pytest.approx(4 * (1 - hit) * adapter)
    assert sl["load_seconds_per_step"] == pytest.approx(4 * (1 - hit) * adapter / 55e9)
    assert sl["load_share"] == pytest.approx(sl["load_seconds_per_step"] / rep.section("throughput")["step_seconds"])
    assert sl["full_turnover_seconds"] == pytest.approx(8 * adapter / 55e9)


def test_default_requests_per_step_is_batch_over_output_tokens():
    rep = compute(Scenario(tenants=100, model="llama-3-8b", output_tokens=128))
    assert rep.section("slots")["requests_per_step"] == pytest.approx(rep.section("throughput")["batch"] / 128)


def test_thrash_warning_when_loads_outrun_the_step():
    calm = compute(Scenario(tenants=1000, model="llama-3-8b", rank=64, targets="all", max_loras=8))
    storm = compute(
        Scenario(
            tenants=1000, model="llama-3-8b", rank=64, targets="all", max_loras=8, requests_per_step=64, pcie_gbs=25
        )
    )
    assert calm.section("slots")["load_share"] < 1 and not any("thrash" in w for w in calm.warnings)
    assert storm.section("slots")["load_share"] > 1 and any("thrash" in w for w in storm.warnings)


def test_popular_tenants_hit_more_often():
    uni = compute(Scenario(tenants=200, model="llama-3-8b", max_loras=64, requests_per_step=2)).section("slots")
    zipf = compute(
        Scenario(tenants=200, model="llama-3-8b", max_loras=64, requests_per_step=2, popularity="zipf", zipf_s=1.2)
    ).section("slots")
    assert zipf["hit_rate"] > uni["hit_rate"]
    assert zipf["loads_per_step"] < uni["loads_per_step"]
