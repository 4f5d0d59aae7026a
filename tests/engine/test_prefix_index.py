"""BlockManager's prefix cache by hand (engine/prefix_cache.py): keys chain whole prefixes under one identity,
idle blocks are free memory handed out least recently released first (a prefix's tail before its head), an
evicted block's children are never reached again, and two sequences computing the same prefix keep one entry."""

from __future__ import annotations

from multilora_cli.config import SamplingParams
from multilora_cli.engine.block_manager import BlockManager
from multilora_cli.engine.request import Request
from multilora_cli.engine.sequence import Sequence

BS = 4


def seq(i: int, tokens: list[int], ident: str | None = "base") -> Sequence:
    s = Sequence(seq_id=i, request=Request(key=i, id=str(i), sampling=SamplingParams()), prompt_token_ids=tokens)
    s.prefix_id = ident
    return s


def compute(bm: BlockManager, s: Sequence) -> list[int]:
    """Start `s` from its hits, then 'compute' its whole prompt and register its full blocks; returns its hits."""
    hits = bm.lookup(s)
    assert bm.can_begin(s, hits, s.num_tokens)
    bm.begin(s, hits)
    bm.allocate(s, s.num_tokens)
    s.num_computed_tokens = s.num_tokens
    bm.register(s)
    return hits


P = list(range(10, 23))  # 13 tokens: 3 full blocks before the last token


def test_hit_takes_the_full_blocks_before_the_last_token_under_the_same_identity_only():
    bm = BlockManager(20, BS)
    a = seq(0, P)
    assert compute(bm, a) == []
    assert len(bm.cache) == 3  # blocks 0-2 full; the 13th token's block is partial
    b = seq(1, P)
    assert compute(bm, b) == a.block_table[:3] and bm.hit_tokens == 12
    assert [bm.refcount(x) for x in a.block_table[:3]] == [2, 2, 2]
    assert compute(bm, seq(2, P, "lora:x")) == []  # another adapter: nothing
    assert compute(bm, seq(3, P[:4] + [99] + P[5:])) == [a.block_table[0]]  # diverges in block 1
    assert compute(bm, seq(4, P[:12])) == a.block_table[:2]  # 12 tokens: its last token's block is computed
    assert bm.hit_tokens == 12 + 0 + 4 + 8 and bm.prompt_tokens == 13 * 4 + 12


def test_a_request_that_may_not_take_hits_still_registers():
    bm = BlockManager(20, BS)
    a = seq(0, P)
    a.request.prefix_hits = False
    compute(bm, a)
    b = seq(1, P)
    b.request.prefix_hits = False
    assert compute(bm, b) == [] and bm.lookup(seq(2, P)) == a.block_table[:3]


def test_idle_blocks_are_free_memory_evicted_tail_first():
    bm = BlockManager(6, BS)
    a = seq(0, P)  # 4 blocks, 3 registered
    compute(bm, a)
    table = list(a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 6 and bm.cache.num_idle == 3
    other = seq(1, [200 + i for i in range(13)], ident=None)  # takes no part: needs 4 blocks, 3 plain free
    compute(bm, other)
    assert bm.cache.num_evicted == 1
    assert bm.lookup(seq(2, P)) == table[:2]  # the tail block (2) went first, the head is still cached
    bm.free(other)
    assert bm.lookup(seq(3, P)) == table[:2]
    assert bm.num_free_blocks == 6


def test_children_of_an_evicted_block_are_unreachable():
    bm = BlockManager(8, BS)
    a = seq(0, P)
    compute(bm, a)
    bm.free(a)
    # evict everything idle: a's 3 cached blocks go, tail first, then the head
    hog = seq(1, list(range(300, 300 + 8 * BS)), ident=None)
    bm.allocate(hog, 8 * BS)
    assert bm.cache.num_evicted == 3 and len(bm.cache) == 0
    bm.free(hog)
    assert bm.lookup(seq(2, P)) == []
    c = seq(3, P)
    compute(bm, c)  # recomputed and registered afresh, under new nodes
    assert bm.lookup(seq(4, P)) == c.block_table[:3]


def test_two_sequences_computing_one_prefix_keep_one_entry():
    bm = BlockManager(20, BS)
    a, b = seq(0, P), seq(1, P)
    for s in (a, b):  # both admitted before either registered (the scheduler avoids this; the index copes)
        bm.begin(s, bm.lookup(s))
        bm.allocate(s, s.num_tokens)
    for s in (a, b):
        s.num_computed_tokens = s.num_tokens
        bm.register(s)
    assert len(bm.cache) == 3 and b.cache_nodes == a.cache_nodes
    first = a.block_table[:3]
    bm.free(a)
    bm.free(b)
    assert bm.cache.num_idle == 3 and bm.num_free_blocks == 20  # b's copies went back as plain blocks
    assert bm.lookup(seq(2, P)) == first


def test_a_chain_whose_parent_was_evicted_registers_nothing_more():
    """b computed P beside a (its copies unregistered, its chain a's nodes); a's blocks are evicted; b's next full
    block would hang under a dead node: it is not registered (nobody could reach it)."""
    bm = BlockManager(12, BS)
    a, b = seq(0, P), seq(1, P[:12] + [50, 51, 52, 53, 54])
    for s, n in ((a, 13), (b, 12)):  # both start before either registers
        bm.begin(s, bm.lookup(s))
        bm.allocate(s, n)
    for s, n in ((a, 13), (b, 12)):
        s.num_computed_tokens = n
        bm.register(s)
    assert b.cache_nodes == a.cache_nodes and len(bm.cache) == 3
    bm.free(a)
    hog = seq(2, list(range(300, 336)), ident=None)
    bm.allocate(hog, 36)  # 9 blocks: the 6 plain free ones and the 3 idle
    assert bm.cache.num_evicted == 3 and len(bm.cache) == 0
    bm.free(hog)
    bm.allocate(b, 17)
    b.num_computed_tokens = 17
    bm.register(b)
    assert len(bm.cache) == 0 and bm.lookup(seq(3, b.token_ids + [9])) == []
