"""Scheduler: continuous batching, adapter limits and grouping, token budget, preemption, failures, feeding.

Every test drives the real scheduler loop through `engine_sim.Sim`, which checks the paged-KV contents each
step and that every sequence's tokens equal what an undisturbed run would give."""

from __future__ import annotations

import random

import pytest

from multilora_cli.config import EngineConfig
from multilora_cli.errors import AdapterError, EngineError, RequestError
from tests.engine.engine_sim import Sim, expected_output, make_seq


def cfg(**kw) -> EngineConfig:
    base = dict(model="m", max_loras=2, max_cpu_loras=4, max_num_seqs=4, max_num_batched_tokens=64, block_size=4)
    return EngineConfig(**{**base, **kw})


def check_outputs(finished, n):
    assert len(finished) == n
    assert len({s.seq_id for s in finished}) == n
    for s in finished:
        assert s.error is None, s.error
        assert s.finish_reason == "length"
        assert s.output_token_ids == expected_output(s)


def test_continuous_batching_admits_as_others_finish():
    sim = Sim(cfg(max_num_seqs=3), num_blocks=200)
    seqs = [make_seq(i, None, 5, max_tokens=3 + 4 * (i % 3)) for i in range(9)]
    check_outputs(sim.run(seqs), 9)
    # a sequence joins the step right after one finishes, while the others keep decoding
    first_done = min(sim.finished_step.values())
    late = [i for i, st in sim.admitted_step.items() if st == first_done]
    assert late, "nobody was admitted when the first sequence finished"
    assert sim.log[first_done].running == 3
    assert max(l.running for l in sim.log) <= 3
    assert sim.sched.num_steps == len(sim.log)


def test_ten_adapters_two_slots_never_more_than_max_loras():
    sim = Sim(cfg(max_loras=2, max_num_seqs=6), num_blocks=200)
    seqs = [make_seq(i, f"a{i % 10}", 3 + i % 5, max_tokens=4 + i % 3) for i in range(60)]
    check_outputs(sim.run(seqs), 60)
    assert max(len(l.adapters - {None}) for l in sim.log) <= 2
    assert max(len(l.resident) for l in sim.log) <= 2
    st = sim.slots.stats()
    assert set(st["adapter_loads"]) == {f"a{i}" for i in range(10)}
    assert st["loads"] == sum(st["adapter_loads"].values()) >= 10
    assert st["evictions"] == st["loads"] - 2  # every load after the first two replaced someone
    assert st["hits"] + st["loads"] == 60  # one acquire per admission


def test_defer_not_barrier():
    """With one slot pinned by a running adapter, a waiting request for another adapter waits while later
    requests for the pinned adapter go first."""
    sim = Sim(
        cfg(max_loras=1, max_num_seqs=4, max_num_batched_tokens=32), num_blocks=100, scheduler_kw=dict(policy="fifo")
    )
    sim.sched.add(make_seq(0, "A", 4, max_tokens=12))
    sim.step()  # A runs and pins the only slot
    sim.sched.add(make_seq(1, "B", 4, max_tokens=3))
    sim.sched.add(make_seq(2, "A", 4, max_tokens=3))
    sim.step()
    assert {s.seq_id for s in sim.sched.running} == {0, 2}  # 2 went ahead of 1 even under FIFO
    check_outputs(sim.run(), 3)
    assert sim.admitted_step[1] > sim.finished_step[2]  # B only got the slot once A's requests were done


def mixed_workload(n_adapters: int, per_adapter: int, seed: int):
    rnd = random.Random(seed)
    return [
        make_seq(i, f"a{rnd.randrange(n_adapters)}", 4 + rnd.randrange(12), max_tokens=2 + rnd.randrange(12))
        for i in range(n_adapters * per_adapter)
    ]


def run_policy(policy, seqs=(), feed=None, window=None):
    sim = Sim(
        cfg(max_loras=8, max_num_seqs=16, max_cpu_loras=64),
        num_blocks=2000,
        scheduler_kw=dict(policy=policy, waiting_window=window),
    )
    check_outputs(sim.run(seqs, feed=feed), 128)
    assert max(len(l.adapters - {None}) for l in sim.log) <= 8
    return sim.slots.loads


@pytest.mark.parametrize("seed", [0, 1])
def test_grouping_swaps_less_than_fifo(seed):
    """16 adapters in random order, 8 slots. Deferral alone already keeps pinned adapters busy; grouping also
    prefers adapters still resident, so each adapter is loaded once, where arrival order churns the slots."""
    fifo = run_policy("fifo", mixed_workload(16, 8, seed))
    group = run_policy("group", mixed_workload(16, 8, seed))
    assert group == 16
    assert fifo > group


def test_grouping_with_lazy_window_still_helps():
    fifo = run_policy("fifo", feed=mixed_workload(16, 8, 3), window=32)
    group = run_policy("group", feed=mixed_workload(16, 8, 3), window=32)
    assert group < fifo


def test_window_bounds_waiting():
    sim = Sim(cfg(max_num_seqs=2), num_blocks=100, scheduler_kw=dict(waiting_window=5))
    fed = []

    def feed():
        for i in range(30):
            fed.append(i)
            assert sim.sched.num_waiting <= 5
            yield make_seq(i, None, 3, max_tokens=2)

    check_outputs(sim.run(feed=feed()), 30)
    assert len(fed) == 30 and sim.sched.num_waiting == 0 and sim.sched.wants_more()


def test_token_budget_max_num_seqs_and_chunked_prefill():
    sim = Sim(cfg(max_num_seqs=3, max_num_batched_tokens=16), num_blocks=200)
    seqs = [make_seq(i, None, 40 if i % 2 else 5, max_tokens=4) for i in range(8)]
    check_outputs(sim.run(seqs), 8)
    assert max(l.batch.num_tokens for l in sim.log) == 16
    assert max(l.batch.num_seqs for l in sim.log) <= 3
    chunked = [
        l
        for l in sim.log
        for s, st, n, smp in zip(l.batch.seqs, l.batch.start, l.batch.num_new_tokens, l.batch.sample)
        if s.num_prompt_tokens == 40 and st > 0 and n > 1
    ]
    assert chunked  # 40-token prompts were fed in several chunks
    mixed = [l for l in sim.log if any(l.decodes) and not all(l.decodes)]
    assert mixed  # decodes and prefill chunks shared steps


def test_split_prefill_decode_steps():
    sim = Sim(
        cfg(max_num_seqs=3, max_num_batched_tokens=16), num_blocks=200, scheduler_kw=dict(mix_prefill_decode=False)
    )
    seqs = [make_seq(i, None, 30 if i % 2 else 6, max_tokens=5) for i in range(7)]
    check_outputs(sim.run(seqs), 7)
    assert any(all(l.decodes) for l in sim.log) and any(not any(l.decodes) for l in sim.log)
    for l in sim.log:
        assert all(l.decodes) or not any(l.decodes)  # a step is all decodes or all prefill


def test_whole_prompts_when_chunking_off():
    sim = Sim(cfg(max_num_seqs=3, max_num_batched_tokens=16), num_blocks=200, scheduler_kw=dict(chunked_prefill=False))
    seqs = [make_seq(i, None, 30 if i == 1 else 6, max_tokens=5) for i in range(5)]
    check_outputs(sim.run(seqs), 5)
    for l in sim.log:
        for st, n in zip(l.batch.start, l.batch.num_new_tokens):
            assert st == 0 or n == 1  # prompts go in whole
        over = l.batch.num_tokens > 16
        if over:  # only a lone prompt may exceed the budget
            assert sum(n > 1 for n in l.batch.num_new_tokens) == 1


@pytest.mark.parametrize("mix", [True, False])
def test_preemption_when_kv_runs_out_recomputes_exactly(mix):
    # 6 sequences of 8 + 14 tokens need 36 blocks of 4 at full length; the cache has 14
    sim = Sim(cfg(max_num_seqs=6, max_num_batched_tokens=64), num_blocks=14, scheduler_kw=dict(mix_prefill_decode=mix))
    seqs = [make_seq(i, f"a{i % 2}", 8, max_tokens=14) for i in range(6)]
    check_outputs(sim.run(seqs), 6)
    assert sim.sched.num_preemptions > 0
    assert sum(s.num_preemptions for s in sim.finished) == sim.sched.num_preemptions
    assert sim.bm.num_free_blocks == 14
    assert sim.slots.num_pinned == 0


def test_sequence_that_can_never_fit_fails_others_complete():
    sim = Sim(cfg(max_num_seqs=4), num_blocks=6)  # 24 tokens of KV
    big = make_seq(0, None, 10, max_tokens=20)
    ok = [make_seq(i, None, 6, max_tokens=4) for i in range(1, 4)]
    done = sim.run([big, *ok])
    failed = [s for s in done if s.error is not None]
    assert [s.seq_id for s in failed] == [0] and isinstance(failed[0].error, EngineError)
    assert "KV blocks" in failed[0].error.message
    check_outputs([s for s in done if s.error is None], 3)


def test_prompt_longer_than_max_model_len_fails():
    sim = Sim(cfg(max_model_len=16), num_blocks=50)
    done = sim.run([make_seq(0, None, 16, max_tokens=2), make_seq(1, None, 8, max_tokens=20)])
    by_id = {s.seq_id: s for s in done}
    assert isinstance(by_id[0].error, RequestError) and by_id[0].error.code == "prompt_too_long"
    assert by_id[1].error is None and by_id[1].finish_reason == "length"
    assert by_id[1].num_tokens == 16  # stopped at max_model_len


def test_adapter_load_failure_fails_its_requests_only():
    sim = Sim(cfg(max_loras=2), num_blocks=100, fail_load={"bad"})
    seqs = [make_seq(i, "bad" if i % 3 == 0 else f"a{i % 2}", 4, max_tokens=3) for i in range(9)]
    done = sim.run(seqs)
    bad = [s for s in done if s.adapter == "bad"]
    assert len(bad) == 3 and all(isinstance(s.error, AdapterError) for s in bad)
    check_outputs([s for s in done if s.adapter != "bad"], 6)


def test_starving_adapter_gets_a_slot_within_defer_limit():
    """A stream of 'A' requests keeps the only slot busy; 'B' (queued early) must not wait for the stream
    to end: after defer_limit admissions the scheduler drains the slot for it."""

    def stream():
        yield make_seq(0, "A", 4, max_tokens=3)
        yield make_seq(1, "B", 4, max_tokens=3)
        for i in range(2, 200):
            yield make_seq(i, "A", 4, max_tokens=3)

    limit = 10
    sim = Sim(cfg(max_loras=1, max_num_seqs=4), num_blocks=100, scheduler_kw=dict(waiting_window=8, defer_limit=limit))
    check_outputs(sim.run(feed=stream()), 200)
    order = sorted(sim.admitted_step, key=lambda i: (sim.admitted_step[i], i))
    assert order.index(1) <= limit + 1 + 4  # deferred at most ~defer_limit admissions (+ the running ones)
    no_drain = Sim(
        cfg(max_loras=1, max_num_seqs=4), num_blocks=100, scheduler_kw=dict(waiting_window=8, defer_limit=10_000)
    )
    no_drain.run(feed=stream())
    late = sorted(no_drain.admitted_step, key=lambda i: (no_drain.admitted_step[i], i)).index(1)
    assert late > order.index(1)


def test_waiting_floor_bounds_every_waiting_sequence():
    """`WaitingQueues.floor` (admission skips its walk of the queue heads while nothing can be past defer_limit):
    never above a waiting sequence's enqueued_at, pushes (a preempted one at the front too) lower it, pops leave
    it, and `refresh_floor` makes it exact."""
    from multilora_cli.engine.waiting import WaitingQueues

    for block in (None, 4):
        w = WaitingQueues(prefix_block=block)
        seqs = [make_seq(i, "AB"[i % 2], 4, max_tokens=2) for i in range(6)]
        for i, s in enumerate(seqs):
            s.enqueued_at = 10 + i
            w.push(s)
        assert w.floor == 10
        w.pop("A")
        w.pop("B")
        assert w.floor == 10 and min(s.enqueued_at for a in ("A", "B") for s in w._q[a]) == 12
        w.refresh_floor()
        assert w.floor == 12
        back = make_seq(9, "B", 4, max_tokens=2)
        back.enqueued_at = 3  # a preempted sequence keeps an older count
        w.push(back, front=True)
        assert w.floor == 3 and w.oldest() is back


def test_schedule_twice_without_postprocess_is_an_error():
    sim = Sim(cfg(), num_blocks=20)
    sim.sched.add(make_seq(0, None, 4, max_tokens=2))
    assert sim.sched.schedule() is not None
    with pytest.raises(RuntimeError):
        sim.sched.schedule()


def test_step_plan_puts_one_token_entries_first_stably():
    from multilora_cli.engine.batch import StepPlan

    seqs = [make_seq(i, None, prompt_len=5, max_tokens=4) for i in range(5)]
    for s in seqs[1::2]:
        s.num_computed_tokens = 4  # one prompt token left: a one-token entry, sampled
    plan = StepPlan(64)
    for s in seqs:  # prefill 3 of 5, one, prefill 3 of 5, one, prefill 3 of 5
        plan.add(s, 1 if s.num_computed_tokens else 3)
    b = plan.to_batch(block_size=4)
    assert [s.seq_id for s in b.seqs] == [1, 3, 0, 2, 4]
    assert b.num_new_tokens == [1, 1, 3, 3, 3] and b.num_decodes == 2
    assert b.start == [4, 4, 0, 0, 0] and b.sample == [True, True, False, False, False]
    decodes = StepPlan(64)
    for s in (seqs[3], seqs[1]):
        decodes.add(s, 1)
    b = decodes.to_batch(block_size=4)
    assert [s.seq_id for s in b.seqs] == [3, 1] and b.num_decodes == 2 and b.is_decode_only


@pytest.mark.parametrize("run_ahead", [False, True])
@pytest.mark.parametrize("kind", ["short", "chunked", "scored"])
def test_an_adapter_found_broken_after_admission_fails_its_sequences_only(run_ahead, kind):
    """What the engine does when a slot load's device check finds a NaN (Engine._verify): after the first step
    that ran the adapter, its running and waiting sequences fail with the error (a step launched ahead drops their
    tokens), the adapter is refused from then on without another read, and every other sequence completes as it
    would have. Its sequences in that first step may sample nothing there: a prompt chunked over several steps
    ("chunked"), or a scored prompt ("scored")."""
    err = AdapterError("adapter 'bad': lora_B contains NaN or Inf values")
    found = []

    def verify(batch):
        if not found and sim.slots.slot_of("bad") in batch.slots:
            found.append(len(sim.log))
            assert sim.sched.fail_adapter("bad", err) >= 1
            sim.slots.refuse("bad", err)

    budget = dict(max_num_batched_tokens=16) if kind == "chunked" else {}
    sim = Sim(
        cfg(max_loras=2, max_num_seqs=4, **budget), num_blocks=200, run_ahead=run_ahead, before_postprocess=verify
    )
    long = 40 if kind == "chunked" else 0
    seqs = [make_seq(i, ["bad", "good", None][i % 3], 4 + i % 5 + long * (i % 3 == 0), max_tokens=6) for i in range(18)]
    if kind == "scored":
        for seq in seqs[::3]:
            seq.request.generate = False
    done = sim.run(seqs)
    assert len(done) == 18 and found
    bad = [s for s in done if s.adapter == "bad"]
    assert all(s.error is err and s.finish_reason is None for s in bad)
    check_outputs([s for s in done if s.adapter != "bad"], 12)
    assert sim.slots.slot_of("bad") is None and sim.slots.adapter_loads["bad"] == 1
    with pytest.raises(AdapterError) as e:
        sim.slots.acquire("bad")
    assert e.value is err
    # nothing of it is left pinned or queued
    assert sim.slots.refcount("bad") == 0 and "bad" not in sim.sched._waiting
