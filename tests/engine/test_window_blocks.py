"""Sliding window in the KV bookkeeping: a sequence drops the blocks behind its window (BlockManager.slide), so a
long generation holds ~W / block_size + 1 blocks, and decode, chunked prefill, n > 1 forks, the prefix cache,
preemption and run-ahead stay exact.

The scheduler tests drive the real loop through `engine_sim.Sim` with a window: each step it checks that every
position a query reads (from the step's first query's window on) holds that sequence's right token in a block it
still holds, that dropped entries are -1 and never counted as held, and that ref counts match the tables."""

from __future__ import annotations

import pytest

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.block_manager import DROPPED, BlockManager, cdiv
from multilora_cli.engine.request import Request
from multilora_cli.engine.sequence import Sequence
from multilora_cli.errors import EngineError
from tests.engine.engine_sim import Sim, expected_output, make_seq
from tests.engine.test_engine_fork import check_samples

W, BS = 8, 4


def cfg(**kw) -> EngineConfig:
    base = dict(model="m", max_loras=2, max_cpu_loras=4, max_num_seqs=8, max_num_batched_tokens=16, block_size=BS)
    return EngineConfig(**{**base, **kw})


def check(finished: list[Sequence], num: int) -> None:
    assert len(finished) == num
    for s in finished:
        assert s.error is None, s.error
        assert s.output_token_ids == expected_output(s)


def held(seq: Sequence) -> int:
    return len(seq.block_table) - seq.num_dropped


def run_holding(sim: Sim, seqs: list[Sequence]) -> tuple[int, int]:
    """Run `seqs` to the end; the most blocks one sequence held in a step where it decoded, and in any step."""
    for s in seqs:
        sim.sched.add(s)
    decode = chunk = 0
    while sim.sched.has_unfinished():
        b = sim.step()
        for s, n in zip(b.seqs, b.num_new_tokens) if b else ():
            chunk = max(chunk, held(s))
            if n == 1:
                decode = max(decode, held(s))
    return decode, chunk


# --- BlockManager.slide ----------------------------------------------------------------------------------------
def _seq(i: int, prompt_len: int) -> Sequence:
    return make_seq(i, None, prompt_len, max_tokens=4)


def test_slide_drops_exactly_the_blocks_no_later_query_reads():
    """A query at p reads (p - W, p]: from first query q on, positions <= q - W are dead; block i (positions
    4i .. 4i+3) goes once 4i + 3 <= q - W."""
    bm = BlockManager(16, BS, window=W)
    seq = _seq(0, 40)
    bm.allocate(seq, 40)
    for q, dropped in [(0, 0), (10, 0), (11, 1), (14, 1), (15, 2), (39, 8), (40, 8)]:
        bm.slide(seq, q)
        assert seq.num_dropped == dropped, q
        assert seq.block_table[:dropped] == [DROPPED] * dropped
        assert all(b >= 0 for b in seq.block_table[dropped:])
        assert len(seq.block_table) == 10  # positions keep their entries
        assert bm.num_free_blocks == 6 + dropped
    bm.free(seq)
    assert bm.num_free_blocks == 16 and seq.num_dropped == 0 and seq.block_table == []
    assert all(bm.refcount(b) == 0 for b in range(16))


def test_slide_without_window_keeps_everything():
    bm = BlockManager(16, BS)
    seq = _seq(0, 40)
    bm.allocate(seq, 40)
    bm.slide(seq, 40)
    assert seq.num_dropped == 0 and bm.num_free_blocks == 6


def test_shared_blocks_return_when_their_last_holder_drops_them():
    bm = BlockManager(16, BS, window=W)
    a, b = _seq(0, 24), _seq(1, 24)
    bm.allocate(a, 24)
    bm.slide(a, 12)  # a drops block 0 before b shares its first 4 blocks
    bm.share(a, b, 4)
    assert b.block_table[0] == DROPPED and b.num_dropped == 1
    assert [bm.refcount(x) for x in a.block_table[1:4]] == [2, 2, 2]
    bm.slide(a, 20)  # a drops blocks 1, 2: b still holds them
    assert [bm.refcount(x) for x in b.block_table[1:3]] == [1, 1] and bm.num_free_blocks == 16 - 6 + 1
    bm.slide(b, 20)
    assert bm.num_free_blocks == 16 - 6 + 3
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 16 and all(bm.refcount(x) == 0 for x in range(16))


def test_a_dropped_registered_block_stays_a_whole_prefix_hit():
    """A dropped block's KV is complete: registered, it idles in the prefix cache and a later sequence with the same
    tokens starts from it (then drops what lies behind its own window)."""
    bm = BlockManager(32, BS, window=W)
    a = _seq(0, 30)
    a.prefix_id = "x"
    bm.allocate(a, 30)
    a.num_computed_tokens = 28
    bm.register(a)  # 7 full blocks
    bm.slide(a, 28)  # drops blocks 0 .. 4 (positions <= 20)
    assert a.num_dropped == 5 and bm.cache.num_idle == 5
    b = _seq(0, 30)  # same tokens
    b.prefix_id = "x"
    hits = bm.lookup(b)
    assert len(hits) == 7 and hits[5:] == a.block_table[5:7]
    bm.begin(b, hits)
    assert bm.cache.num_idle == 0 and b.num_computed_tokens == 28
    bm.slide(b, 28)
    assert bm.cache.num_idle == 5 and b.num_dropped == 5


def test_blocks_at_once_is_bounded_by_window_and_chunk():
    bm = BlockManager(100, BS, window=W)
    assert bm.blocks_at_once(12, chunk=1) == 3  # fewer tokens than the bound
    assert bm.blocks_at_once(1000, chunk=1) == cdiv(W, BS) + 1
    assert bm.blocks_at_once(1000, chunk=16) == cdiv(W - 1 + 16, BS) + 1
    assert BlockManager(100, BS).blocks_at_once(1000, chunk=1) == 250


# --- the scheduler loop --------------------------------------------------------------------------------------
@pytest.mark.parametrize("run_ahead", [False, True])
def test_long_generations_hold_the_window_only(run_ahead):
    """Prompts of 30-37 tokens (chunks of up to 16) and 60 generated: exact tokens, every read in held blocks;
    while decoding each sequence holds at most cdiv(W, bs) + 1 = 3 blocks, and the cache ends empty."""
    sim = Sim(cfg(), num_blocks=200, window=W, run_ahead=run_ahead)
    decode_peak, chunk_peak = run_holding(sim, [make_seq(i, f"a{i % 2}", 30 + i, max_tokens=60) for i in range(6)])
    check(sim.run(), 6)
    assert decode_peak == cdiv(W, BS) + 1
    assert chunk_peak <= cdiv(W - 1 + 16, BS) + 1
    assert sim.bm.num_free_blocks == 200 and all(sim.bm.refcount(b) == 0 for b in range(200))
    if run_ahead:
        assert sim.sched.num_ahead_steps > 0


def test_a_cache_smaller_than_one_sequence_serves_it_with_a_window():
    """90 + 200 tokens need 73 blocks of 4 without a window: refused then; with W = 8 and chunks of 16 a sequence
    holds at most 7 at once, so a 12-block cache serves four of them (preempting as it runs short)."""
    seqs = lambda: [make_seq(i, None, 90, max_tokens=200) for i in range(4)]  # noqa: E731
    full = Sim(cfg(max_num_seqs=4), num_blocks=12)
    done = full.run(seqs())
    assert all(isinstance(s.error, EngineError) for s in done)
    sim = Sim(cfg(max_num_seqs=4), num_blocks=12, window=W)
    check(sim.run(seqs()), 4)
    assert sim.sched.num_preemptions > 0
    assert sim.bm.num_free_blocks == 12


@pytest.mark.parametrize("prompt_len", [16, 17, 19, 33])
@pytest.mark.parametrize("two", [False, True])
def test_forks_read_the_window_of_the_blocks_they_share(prompt_len, two):
    """n = 3 of prompts longer than the window, prefilled in chunks of 5: sample 0 keeps the blocks its forks
    read (from the prompt's last full block back by W) until they fork; each sample then slides on its own.
    (16 tokens: the last chunk is token 15 alone; sliding by it would drop block 1, which the forks, querying from
    position 12, still read.)"""
    sim = Sim(cfg(max_num_batched_tokens=5), num_blocks=200, window=W)
    reqs = [make_seq(0, None, prompt_len, max_tokens=30, n=3, temperature=1.0)]
    if two:
        reqs.append(make_seq(1, "a", prompt_len + 2, max_tokens=25, n=2, seq_id=3, temperature=1.0))
    check_samples(sim.run(reqs), {0: 3, 1: 2} if two else {0: 3})
    assert sim.sched.num_forks == 1 + two and sim.bm.num_shared > 0
    assert sim.bm.num_free_blocks == 200


def test_prefix_cache_hits_with_a_window_and_a_tight_cache():
    """Shared 21-token prefixes under two adapters, a cache tight enough to evict and preempt: hits still come
    from the right writer (Sim checks) and every output is exact."""
    head = [[5 + (h * 31 + j * 7) % 90 for j in range(21)] for h in range(2)]
    out = []
    for i in range(12):
        a = ("a", "b")[i % 2]
        req = Request(key=i, id=f"r{i}", adapter=a, sampling=SamplingParams(max_tokens=20 + i))
        s = Sequence.from_request(i, req, head[i % 2] + [100 + i, 101 + i], engine_seed=1)
        s.prefix_id = f"id:{a}"
        out.append(s)
    sim = Sim(cfg(max_num_seqs=6, max_num_batched_tokens=8), num_blocks=24, window=W)
    check(sim.run(out), 12)
    assert sim.bm.hit_tokens > 0
    assert sim.bm.num_free_blocks == 24


def test_long_rope_prompts_keep_their_blocks_until_the_switch():
    """A LongRoPE model (`private_prompts_upto` = its switch at 20) recomputes a short prompt's positions 0 .. 19
    in place at the switch: those blocks are kept until the sequence is past it, then the window slides."""
    sim = Sim(cfg(), num_blocks=200, window=W, scheduler_kw=dict(private_prompts_upto=20))
    short, long_ = make_seq(0, None, 12, max_tokens=30), make_seq(1, None, 26, max_tokens=10)
    sim.sched.add(short)
    sim.sched.add(long_)
    seen = {0: [], 1: []}
    while sim.sched.has_unfinished():
        b = sim.step()
        for s in b.seqs if b else []:
            seen[s.seq_id].append((s.num_computed_tokens, s.num_dropped))
    check(sim.finished, 2)
    assert all(d == 0 for c, d in seen[0] if c <= 20)
    assert max(d for _, d in seen[0]) > 0
    assert max(d for _, d in seen[1]) > 0  # rotated long from the start: slides at once
