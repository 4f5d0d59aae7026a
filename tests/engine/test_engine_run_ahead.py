"""Scheduler.schedule_ahead: the next decode step planned (and run) before this step's ids reach the host.

Driven through `engine_sim.Sim(run_ahead=True)`, which runs each ahead step (writes and checks its paged KV)
before postprocessing the step before it, as the engine does on a GPU. The tokens must be exactly those of the
one-step-at-a-time loop, and without early stops the steps themselves must be the same."""

from __future__ import annotations

import pytest

from multilora_cli.config import EngineConfig
from multilora_cli.engine.detokenizer import StopChecker
from tests.engine.engine_sim import Sim, expected_output, make_seq


def cfg(**kw) -> EngineConfig:
    base = dict(model="m", max_loras=2, max_cpu_loras=4, max_num_seqs=4, max_num_batched_tokens=64, block_size=4)
    return EngineConfig(**{**base, **kw})


def _steps(sim: Sim) -> list[tuple]:
    return [
        (tuple(s.seq_id for s in l.batch.seqs), tuple(l.batch.num_new_tokens), tuple(l.batch.start)) for l in sim.log
    ]


def _pair(config, num_blocks, make, stop=None, **kw):
    out = []
    for ahead in (False, True):
        sim = Sim(config, num_blocks=num_blocks, run_ahead=ahead, **kw)
        done = sim.run(make(), stop=stop)
        out.append((sim, {s.seq_id: (s.output_token_ids, s.finish_reason) for s in done}))
    return out


@pytest.mark.parametrize("max_num_seqs,n,blocks", [(4, 4, 100), (4, 11, 100), (3, 9, 200), (6, 6, 14)])
def test_same_steps_and_tokens_without_early_stops(max_num_seqs, n, blocks):
    """Stops only by length (predictable): the ahead loop plans exactly the steps the plain loop plans, so the
    run is the same step for step; it just plans some of them one step earlier. Includes a KV cache too small
    for everyone (6 seqs, 14 blocks: preemption)."""
    make = lambda: [make_seq(i, f"a{i % 3}", 3 + i % 5, max_tokens=5 + 3 * (i % 4)) for i in range(n)]  # noqa: E731
    (plain, want), (ahead, got) = _pair(cfg(max_num_seqs=max_num_seqs), blocks, make)
    assert got == want
    assert all(toks == expected_output(s) for s in ahead.finished for toks, _ in [got[s.seq_id]])
    assert _steps(ahead) == _steps(plain)
    assert ahead.sched.num_ahead_steps > 0 and plain.sched.num_ahead_steps == 0
    assert ahead.bm.num_free_blocks == blocks and ahead.slots.num_pinned == 0


def _stop_on(mod: int):
    """eos-like stops nobody can predict: a sequence stops when its token is divisible by `mod`."""
    base = StopChecker(max_model_len=None)

    def stop(seq):
        return "stop" if seq.token_ids[-1] % mod == 0 else base(seq)

    return stop


@pytest.mark.parametrize("mod", [5, 11, 29])
def test_early_stops_drop_the_extra_token(mod):
    """A sequence that stops at step N was already fed into the ahead step N+1: that token is dropped, its KV
    blocks are freed once, and every sequence's output and finish reason equal the plain loop's."""
    make = lambda: [make_seq(i, None, 4, max_tokens=12) for i in range(10)]  # noqa: E731
    (plain, want), (ahead, got) = _pair(cfg(max_num_seqs=4), 200, make, stop=_stop_on(mod))
    assert got == want
    assert any(r == "stop" for _, r in got.values()) and ahead.sched.num_ahead_steps > 0
    assert ahead.bm.num_free_blocks == 200 and ahead.slots.num_pinned == 0
    assert len(ahead.finished) == 10


def test_no_ahead_step_where_schedule_would_do_something_else():
    from multilora_cli.engine.block_manager import BlockManager
    from multilora_cli.engine.scheduler import Scheduler
    from multilora_cli.engine.slots import SlotManager

    def fresh(max_num_seqs=2):
        c = cfg(max_num_seqs=max_num_seqs)
        slots = SlotManager(2, 4, lambda n: {"name": n}, lambda *a: None, lambda *a: None)
        return Scheduler(c, BlockManager(100, 4), slots)

    def decode_batch(s):  # schedule() until a decode-only step, postprocessed with a dummy id
        while True:
            b = s.schedule()
            if b.is_decode_only:
                return b
            s.postprocess(b, [7] * b.num_sampled, StopChecker())

    s = fresh()
    for i in range(2):
        s.add(make_seq(i, None, 3, max_tokens=5))
    b = decode_batch(s)
    nxt = s.schedule_ahead(b)
    assert nxt is not None and nxt.ahead and nxt.start == [st + 1 for st in b.start]
    assert s.schedule_ahead(b) is None  # two in flight already
    s.postprocess(b, [7, 7], StopChecker())
    s.postprocess(nxt, [7, 7], StopChecker())

    s = fresh(max_num_seqs=3)  # a free seat and a waiting request: the next step admits it
    for i in range(2):
        s.add(make_seq(i, None, 3, max_tokens=5))
    b = decode_batch(s)
    s.add(make_seq(9, None, 3, max_tokens=5))
    assert s.schedule_ahead(b) is None

    s = fresh()  # a sequence reaches max_tokens with this step's token
    s.add(make_seq(0, None, 3, max_tokens=2))
    b = decode_batch(s)
    assert s.schedule_ahead(b) is None

    s = fresh()  # a prefill step is never run ahead of
    s.add(make_seq(0, None, 3, max_tokens=5))
    assert s.schedule_ahead(s.schedule()) is None


def test_no_ahead_step_while_requests_still_come_and_a_seat_is_free():
    from multilora_cli.engine.block_manager import BlockManager
    from multilora_cli.engine.scheduler import Scheduler
    from multilora_cli.engine.slots import SlotManager

    slots = SlotManager(2, 4, lambda n: {"name": n}, lambda *a: None, lambda *a: None)
    s = Scheduler(cfg(max_num_seqs=3), BlockManager(100, 4), slots)
    for i in range(2):
        s.add(make_seq(i, None, 3, max_tokens=6))
    b = s.schedule()
    s.postprocess(b, [7, 7], StopChecker())
    b = s.schedule()
    assert b.is_decode_only and s.num_waiting == 0
    assert s.schedule_ahead(b, more_requests=True) is None  # the caller's next requests would take the seat
    assert s.schedule_ahead(b) is not None
