"""n samples of one prompt in the scheduler: the prompt is prefilled once, its full blocks shared (ref-counted),
each sample's tokens its own seed's, and seats, chunked prefill, preemption and failures stay right.

Every test drives the real scheduler through `engine_sim.Sim`, which checks each step that shared blocks are
held only by the samples of one request, are never written, and hold that request's prompt."""

from __future__ import annotations

import pytest

from multilora_cli.config import EngineConfig
from multilora_cli.engine.sequence import SeqStatus, sample_seed
from tests.engine.engine_sim import Sim, expected_output, fake_token, make_seq


def cfg(**kw) -> EngineConfig:
    base = dict(model="m", max_loras=2, max_cpu_loras=4, max_num_seqs=16, max_num_batched_tokens=64, block_size=4)
    return EngineConfig(**{**base, **kw})


def by_request(finished) -> dict[int, list]:
    out: dict[int, list] = {}
    for s in finished:
        out.setdefault(s.request.key, []).append(s)
    return {k: sorted(v, key=lambda s: s.sample_index) for k, v in out.items()}


def check_samples(finished, requests: dict[int, int]) -> None:
    """Every request key k has its n = requests[k] samples, each with its own seed's tokens."""
    got = by_request(finished)
    assert set(got) == set(requests)
    for key, seqs in got.items():
        n = requests[key]
        assert [s.sample_index for s in seqs] == list(range(n))
        assert [s.seq_id - seqs[0].seq_id for s in seqs] == list(range(n))
        for s in seqs:
            assert s.error is None, s.error
            assert s.finish_reason == "length"
            assert s.seed == sample_seed(seqs[0].seed, s.sample_index)
            assert s.output_token_ids == expected_output(s)
        assert len({s.seed for s in seqs}) == n


def fed_prompt_tokens(sim: Sim) -> int:
    """Tokens fed at positions inside the prompt (prefill work), over the whole run."""
    return sum(
        max(0, min(st + n, s.num_prompt_tokens) - st)
        for log in sim.log
        for s, st, n in zip(log.batch.seqs, log.batch.start, log.batch.num_new_tokens)
    )


def test_n8_prefills_the_prompt_once_and_shares_its_full_blocks():
    sim = Sim(cfg(), num_blocks=200)
    free0 = sim.bm.num_free_blocks
    seq = make_seq(0, None, 33, max_tokens=5, n=8, temperature=1.0)
    check_samples(sim.run([seq]), {0: 8})
    # 33 tokens, blocks of 4: 8 full blocks before the last token are shared; each fork computes token 32 alone
    assert sim.sched.num_forks == 1
    assert sim.bm.num_shared == 7 * 8
    assert fed_prompt_tokens(sim) == 33 + 7 * 1
    # allocated: sample 0's 10 blocks (33 + 4 tokens, the last fed token's KV never written: 36 positions + 1),
    # and 2 per fork (its partial block and the one its 5th token needs), never the prompt's 8 again
    assert sim.bm.num_allocated == 9 + 1 + 7 * 2
    assert sim.bm.num_free_blocks == free0
    assert all(sim.bm.refcount(b) == 0 for b in range(sim.bm.num_blocks))


def test_separate_requests_prefill_every_prompt():
    """The baseline of the test above: 8 requests of the same prompt feed it 8 times."""
    sim = Sim(cfg(), num_blocks=200)
    seqs = [make_seq(0, None, 33, max_tokens=5, seq_id=i, temperature=1.0) for i in range(8)]
    for s in seqs:
        s.request.key = s.seq_id
    sim.run(seqs)
    assert sim.sched.num_forks == 0 and sim.bm.num_shared == 0
    assert fed_prompt_tokens(sim) == 8 * 33


@pytest.mark.parametrize("prompt_len", [1, 3, 4, 5, 16])
def test_short_prompts_and_block_edges(prompt_len):
    sim = Sim(cfg(), num_blocks=100)
    check_samples(sim.run([make_seq(0, "A", prompt_len, max_tokens=4, n=3, temperature=0.7)]), {0: 3})
    assert sim.bm.num_shared == 2 * ((prompt_len - 1) // 4)


def test_sample_zero_is_the_request_alone_and_each_sample_its_seed_alone():
    """Batch invariance through the simulator: sample i's tokens are f(seed_i, position) whatever else runs."""
    sim = Sim(cfg(), num_blocks=300)
    seqs = [make_seq(k, ["A", None, "B"][k % 3], 6 + 3 * k, max_tokens=3 + k, seq_id=10 * k, n=1 + k) for k in range(5)]
    finished = sim.run(seqs)
    check_samples(finished, {k: 1 + k for k in range(5)})
    for s in finished:
        if s.sample_index == 0:  # the request with n=1: same seed, same tokens
            assert s.seed == make_seq(s.request.key, None, 1, max_tokens=1).seed
        assert s.output_token_ids == [fake_token(s.seed, p) for p in range(s.sampling.max_tokens)]


def test_seats_count_every_sample_and_forks_share_the_slot():
    sim = Sim(cfg(max_num_seqs=4, max_loras=1), num_blocks=300)
    seqs = [make_seq(k, "A", 9, max_tokens=6, seq_id=4 * k, n=3) for k in range(4)]
    check_samples(sim.run(seqs), {k: 3 for k in range(4)})
    assert max(log.running for log in sim.log) <= 4
    assert max(log.batch.num_seqs for log in sim.log) <= 4
    assert sim.slots.stats()["loads"] == 1  # one slot, shared by every sample
    assert sim.slots.refcount("A") == 0


def test_more_samples_than_seats_queue_the_rest():
    sim = Sim(cfg(max_num_seqs=3), num_blocks=300)
    check_samples(sim.run([make_seq(0, None, 10, max_tokens=4, n=7, temperature=1.0)]), {0: 7})
    assert max(log.running for log in sim.log) <= 3
    assert sim.bm.num_shared == 2 * 2  # the two forks that found a seat; the four others recomputed the prompt
    assert sim.sched._reserved == 0


def test_chunked_prompt_forks_only_once_it_is_whole():
    sim = Sim(cfg(max_num_batched_tokens=8), num_blocks=200)
    seq = make_seq(0, None, 30, max_tokens=3, n=4, temperature=1.0)
    check_samples(sim.run([seq]), {0: 4})
    first_fork = min(i for i, log in enumerate(sim.log) if any(s.sample_index for s in log.batch.seqs))
    chunks = [log for log in sim.log[:first_fork] if seq in log.batch.seqs]
    assert len(chunks) == 4 and sum(c.batch.num_new_tokens[c.batch.seqs.index(seq)] for c in chunks) == 30
    assert sim.bm.num_shared == 3 * 7


@pytest.mark.parametrize("mix", [True, False])
def test_preemption_with_samples_recomputes_exactly(mix):
    """A cache too small for every sample at once: samples (and sample 0 before its fork) are preempted and
    recomputed, and every sample still gets its own seed's tokens."""
    sim = Sim(
        cfg(max_num_seqs=8, max_num_batched_tokens=32),
        num_blocks=20,
        scheduler_kw=dict(mix_prefill_decode=mix),
    )
    seqs = [make_seq(k, None, 9 + k, max_tokens=12, seq_id=4 * k, n=4, temperature=1.0) for k in range(3)]
    check_samples(sim.run(seqs), {k: 4 for k in range(3)})
    assert sim.sched.num_preemptions > 0
    assert sim.bm.num_free_blocks == 20 and sim.sched._reserved == 0


def test_greedy_requests_fork_too():
    """Greedy n=3: three sequences with their own seeds (argmax ignores them); the fork happens all the same."""
    sim = Sim(cfg(), num_blocks=100)
    finished = sim.run([make_seq(0, None, 7, max_tokens=3, n=3)])
    assert sorted(s.sample_index for s in finished) == [0, 1, 2] and sim.sched.num_forks == 1


def test_failed_adapter_fails_the_request_before_any_fork():
    sim = Sim(cfg(), num_blocks=100, fail_load={"bad"})
    finished = sim.run([make_seq(0, "bad", 5, max_tokens=3, n=4), make_seq(1, None, 5, max_tokens=3, seq_id=4)])
    bad = [s for s in finished if s.request.key == 0]
    assert len(bad) == 1 and bad[0].error is not None and bad[0].pending_forks == 3
    assert sim.sched.num_forks == 0 and sim.sched._reserved == 0
    assert all(s.status is SeqStatus.FINISHED for s in finished)


def test_max_tokens_one_still_gives_every_sample():
    sim = Sim(cfg(), num_blocks=100)
    check_samples(sim.run([make_seq(0, None, 6, max_tokens=1, n=5, temperature=1.0)]), {0: 5})


def test_run_ahead_waits_for_the_forks():
    sim = Sim(cfg(max_num_seqs=4), num_blocks=100, run_ahead=True)
    check_samples(sim.run([make_seq(0, None, 1, max_tokens=6, n=4, temperature=1.0)]), {0: 4})
    assert sim.sched.num_ahead_steps > 0
