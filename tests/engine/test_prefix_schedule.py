"""The prefix cache in the scheduler loop (engine_sim.Sim checks every attended position's KV: a hit must come
from a writer with the same adapter identity and the same tokens, and no cached block is ever written): chunked
prefill, run-ahead, preemption and eviction under a tight cache, n samples, the prefix order of the queues, and
requests that may not take hits."""

from __future__ import annotations

import pytest

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.request import Request
from multilora_cli.engine.sequence import Sequence
from tests.engine.engine_sim import Sim, expected_output

HEADS = [[5 + (h * 31 + j * 7) % 90 for j in range(13)] for h in range(3)]  # 13-token shared prefixes


def cfg(**kw) -> EngineConfig:
    base = dict(model="m", max_loras=2, max_cpu_loras=4, max_num_seqs=8, max_num_batched_tokens=32, block_size=4)
    return EngineConfig(**{**base, **kw})


def seqs(num: int, adapters=("a", "b", None), max_tokens: int = 5, hits: bool = True, **sp) -> list[Sequence]:
    """Request i: adapter i % len(adapters), prefix HEADS[i % 3] + 1-4 own tokens; prefix_id = its adapter."""
    out, next_id = [], 0
    for i in range(num):
        a = adapters[i % len(adapters)]
        prompt = HEADS[i % 3] + [100 + (i * 17 + j) % 50 for j in range(1 + i % 4)]
        req = Request(key=i, id=f"r{i}", adapter=a, sampling=SamplingParams(max_tokens=max_tokens, **sp))
        req.prefix_hits = hits
        s = Sequence.from_request(next_id, req, prompt, engine_seed=1)
        s.prefix_id = f"id:{a}"
        next_id += req.sampling.n
        out.append(s)
    return out


def check(finished: list[Sequence], num: int) -> None:
    assert sorted({s.request.key for s in finished}) == list(range(num))
    for s in finished:
        assert s.error is None, s.error
        assert s.output_token_ids == expected_output(s)


@pytest.mark.parametrize("run_ahead", [False, True])
@pytest.mark.parametrize("budget", [6, 32])
def test_hits_with_chunked_prefill_and_run_ahead(run_ahead, budget):
    sim = Sim(cfg(max_num_batched_tokens=budget), num_blocks=200, run_ahead=run_ahead)
    check(sim.run(seqs(18)), 18)
    # adapter and prefix both follow i % 3: 3 groups of 6, whose 5 later ones start from the prefix's 3 full
    # blocks (their own tokens differ from the 13th on)
    assert sim.bm.hit_tokens == 3 * 5 * 12
    assert sim.bm.prompt_tokens == sum(13 + 1 + i % 4 for i in range(18))


def test_a_group_computes_its_prefix_once_when_admitted_together():
    """8 requests of one prefix arrive at once: the first computes it, the others wait a step for its blocks."""
    sim = Sim(cfg(max_num_batched_tokens=64), num_blocks=200)
    batch = [s for s in seqs(24, adapters=("a",)) if s.request.key % 3 == 0]
    sim.run(batch)
    assert all(s.error is None and s.output_token_ids == expected_output(s) for s in sim.finished)
    assert sim.bm.hit_tokens == 7 * 12


def test_preemption_and_eviction_under_a_tight_cache():
    sim = Sim(cfg(max_num_seqs=6), num_blocks=14)
    check(sim.run(seqs(30, max_tokens=9)), 30)
    assert sim.sched.num_preemptions > 0
    assert sim.bm.cache.num_evicted > 0
    assert sim.bm.hit_tokens > 0
    assert sim.bm.num_free_blocks == sim.bm.num_blocks


def test_n_samples_take_hits_and_fork():
    sim = Sim(cfg(max_num_seqs=12), num_blocks=200)
    batch = seqs(9, n=3, temperature=1.0)
    fin = sim.run(batch)
    assert len(fin) == 27 and all(s.output_token_ids == expected_output(s) for s in fin)
    assert sim.sched.num_forks == 9
    assert sim.bm.hit_tokens > 0


def test_requests_that_may_not_take_hits_compute_their_whole_prompt():
    """`Request.prefix_hits` False (prompt logits needed): no hits for them; their blocks still serve others."""
    sim = Sim(cfg(), num_blocks=200)
    first = seqs(9, hits=False)
    check(sim.run(first), 9)
    assert sim.bm.hit_tokens == 0
    late = seqs(9)
    for s in late:
        s.request.key += 100
        s.seq_id += 100
    sim.run(late)
    # each finds its twin's blocks, idle in the cache: all its full blocks before its last token
    assert sim.bm.hit_tokens == sum((s.num_prompt_tokens - 1) // 4 * 4 for s in late) == 7 * 12 + 2 * 16


def test_identities_never_share():
    """The same prompts under 3 identities: each identity's second copy hits, nothing crosses."""
    sim = Sim(cfg(), num_blocks=200)
    batch = seqs(6, adapters=("a",))
    for i, s in enumerate(batch):
        s.prefix_id = f"id{i % 3}"
        s.prompt_token_ids = list(HEADS[0]) + [7, 7]
        s.token_ids = list(s.prompt_token_ids)
    sim.run(batch)
    assert sim.bm.hit_tokens == 3 * 12


def test_queue_is_in_prefix_order():
    """Arrival order a1 b1 a2 b2 a3 (a, b: first blocks) runs a1 a2 a3 b1 b2 with one seat at a time."""
    sim = Sim(cfg(max_num_seqs=1), num_blocks=200)
    order = [0, 1, 0, 1, 0]
    batch = []
    for i, h in enumerate(order):
        req = Request(key=i, id=f"r{i}", adapter=None, sampling=SamplingParams(max_tokens=2))
        s = Sequence.from_request(i, req, HEADS[h] + [50 + i], engine_seed=1)
        s.prefix_id = "base"
        batch.append(s)
    sim.run(batch)
    assert [s.request.key for s in sim.finished] == [0, 2, 4, 1, 3]
    off = Sim(cfg(max_num_seqs=1, prefix_cache=False), num_blocks=200)
    off.run([Sequence.from_request(s.seq_id, s.request, s.prompt_token_ids, engine_seed=1) for s in batch])
    assert [s.request.key for s in off.finished] == [0, 1, 2, 3, 4] and off.bm.hit_tokens == 0
