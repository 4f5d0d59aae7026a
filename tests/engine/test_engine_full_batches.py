"""Batches stay full when adapters have few requests each (issue 38): a step is short of `max_num_seqs` only when
every slot is pinned by running sequences and no waiting request's adapter holds one, so many single-request
adapters keep the batch at min(max_num_seqs, slots, requests left), and outputs do not depend on the slots."""

from __future__ import annotations

import random

import pytest

from multilora_cli.config import EngineConfig
from tests.engine.engine_sim import Sim, expected_output, make_seq


def _config(max_loras: int, max_num_seqs: int) -> EngineConfig:
    return EngineConfig(
        model="m",
        max_loras=max_loras,
        max_cpu_loras=max_loras,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=4096,
        block_size=4,
    )


def _watch(sim: Sim) -> list[tuple[int, int]]:
    """Check after every schedule(): a seat is free while requests wait only when no waiting adapter could run
    (every slot pinned, none of them by a waiting adapter). Returns (batch size, sequences left) per step."""
    sched, slots, seen = sim.sched, sim.slots, []
    orig = sched.schedule

    def schedule():
        b = orig()
        waiting = sched._waiting.adapters()
        if b is not None:
            seen.append((b.num_seqs, sched.num_running + len(sched._waiting)))
        if waiting and sched.num_seats < sched.max_num_seqs:
            assert slots.num_pinned == slots.max_loras, (sched.num_seats, slots.num_pinned)
            assert not any(slots.is_pinned(a) for a in waiting if a is not None)
        return b

    sched.schedule = schedule
    return seen


@pytest.mark.parametrize("slots, seats", [(16, 32), (32, 16), (64, 64)])
def test_single_request_adapters_keep_the_batch_full(slots, seats):
    sim = Sim(_config(slots, seats), num_blocks=100_000)
    seen = _watch(sim)
    seqs = [make_seq(i, f"a{i}", 6 + i % 5, 4 + i % 3) for i in range(300)]
    done = sim.run(seqs)
    assert sorted(s.seq_id for s in done) == list(range(300))
    assert all(s.output_token_ids == expected_output(s) for s in done)
    assert all(n == min(seats, slots, left) for n, left in seen), seen[:20]
    assert sim.slots.loads == 300  # each adapter loaded once: no slot was given up while its request ran


def test_mixed_queues_fill_seats_as_far_as_slots_allow():
    """Four busy adapters among 200 single-request ones, fed lazily in random order: the watch holds every step."""
    rng = random.Random(3)
    names = [f"busy{i % 4}" if rng.random() < 0.4 else f"one{i}" for i in range(400)]
    seqs = [make_seq(i, a, 4 + rng.randrange(8), 2 + rng.randrange(6)) for i, a in enumerate(names)]
    sim = Sim(_config(12, 24), num_blocks=100_000)
    _watch(sim)
    done = sim.run(feed=iter(seqs))
    assert len(done) == 400 and all(s.output_token_ids == expected_output(s) for s in done)


@pytest.mark.parametrize("threads", [0, 2])
def test_outputs_do_not_depend_on_slots(threads):
    seqs = lambda: [make_seq(i, f"a{i % 150}", 5 + i % 7, 3 + i % 4) for i in range(200)]  # noqa: E731
    runs = {}
    for slots in (8, 150):
        sim = Sim(_config(slots, 32), num_blocks=100_000, prefetch_threads=threads)
        runs[slots] = {s.seq_id: s.output_token_ids for s in sim.run(seqs())}
        sim.slots.close()
    assert runs[8] == runs[150] and len(runs[8]) == 200


def test_per_step_host_work_does_not_grow_with_the_pool():
    """Counts, not times: the prefetch order a step computes and the LoRA metadata a step copies are sized by the
    step (max_num_seqs, max_num_batched_tokens), not by max_loras."""
    from multilora_cli.kernels.meta import LoraMetaBuffers

    longest = {}
    for pool in (64, 1000):
        sim = Sim(_config(pool, 32), num_blocks=100_000, prefetch_threads=1)
        lengths = []
        orig = sim.sched.upcoming_adapters
        sim.sched.upcoming_adapters = lambda k: lengths.append(len(out := orig(k))) or out
        sim.run([make_seq(i, f"a{i}", 4, 3) for i in range(400)])
        sim.slots.close()
        longest[pool] = max(lengths)
    assert longest[64] == longest[1000] == 32  # one wave of seats, however many slots
    sizes = {pool: LoraMetaBuffers(512, pool, "cpu")._host.numel() for pool in (512, 1000, 4096)}
    assert len(set(sizes.values())) == 1, sizes


@pytest.mark.slow
def test_single_request_adapters_through_few_slots_match_hf_peft(tmp_path):
    """The real engine (tiny Llama, fp32 CPU): 12 adapters of one request each and 2 base requests through 3 slots
    and 6 seats give HF + PEFT's greedy tokens, the same as 12 slots; each step holds at most 3 adapters, and the
    base rows fill seats beside them."""
    from multilora_cli.engine.engine import Engine
    from tests.builders import build_mixed
    from tests.engine.test_engine_generate import _hf_greedy, _many_adapters, _prompts, _requests

    base, adapters = build_mixed(tmp_path / "m", "llama")
    many = _many_adapters(tmp_path, adapters["all4rs"], 12)
    plan = [f"ad{i}" for i in range(12)] + [None, None]
    prompts = _prompts(len(plan), seed=4)
    want = _hf_greedy(base, many, prompts, plan)
    got = {}
    for slots in (3, 12):
        cfg = EngineConfig(model=str(base), device="cpu", max_loras=slots, max_lora_rank=8, max_num_seqs=6)
        engine = Engine(cfg, many)
        engine.runner.step_log = []
        got[slots] = [r.token_ids for r in engine.generate_all(_requests(prompts, plan))]
        log = engine.runner.step_log
        assert max(s.adapters for s in log) == min(slots, 6)
        if slots == 3:
            assert max(s.seqs for s in log) == 5  # 3 adapters + the 2 base rows
        engine.close()
    assert got[3] == got[12] == want
