"""SlotManager (LRU slots, pinning, host cache, counters) and BlockManager (paged KV bookkeeping)."""

from __future__ import annotations

import pytest

from multilora_cli.engine.block_manager import BlockManager
from multilora_cli.engine.slots import SlotManager
from multilora_cli.errors import AdapterError
from tests.engine.engine_sim import make_seq


class Backing:
    """Records what the callbacks were asked to do, like the real slot tensors would see it."""

    def __init__(self, fail=()):
        self.disk_reads: list[str] = []
        self.slots: dict[int, str] = {}
        self.fail = set(fail)

    def load_cpu(self, name):
        if name in self.fail:
            raise AdapterError(f"adapter {name!r}: unreadable")
        self.disk_reads.append(name)
        return ("weights", name)

    def install(self, slot, name, obj):
        assert obj == ("weights", name)
        self.slots[slot] = name

    def evict(self, slot, name):
        assert self.slots.pop(slot) == name

    def manager(self, max_loras=2, max_cpu_loras=4):
        return SlotManager(max_loras, max_cpu_loras, self.load_cpu, self.install, self.evict)


def test_base_never_takes_a_slot():
    b = Backing()
    m = b.manager()
    assert m.acquire(None) == -1 and m.slot_of(None) == -1
    m.retain(None)
    m.release(None)
    assert m.loads == m.hits == 0 and b.slots == {}


def test_lru_eviction_and_hits():
    b = Backing()
    m = b.manager(max_loras=2)
    sa, sb = m.acquire("a"), m.acquire("b")
    assert {sa, sb} == {0, 1}
    assert m.acquire("a") == sa and m.hits == 1  # refreshes a: b is now least recently used
    sc = m.acquire("c")
    assert sc == sb and b.slots == {sa: "a", sc: "c"} and m.evictions == 1
    assert m.slot_of("b") is None and m.resident == {"a": sa, "c": sc}


def test_pinned_adapters_are_never_evicted():
    b = Backing()
    m = b.manager(max_loras=2)
    m.acquire("a"), m.retain("a")
    m.acquire("b"), m.retain("b")
    assert not m.can_acquire("c") and m.acquire("c") is None
    assert m.loads == 2 and m.evictions == 0
    m.release("b")
    assert m.can_acquire("c") and m.acquire("c") == 1 and m.slot_of("a") == 0
    m.retain("a")  # refcounts: a pinned twice
    m.release("a")
    assert m.is_pinned("a") and m.refcount("a") == 1
    with pytest.raises(RuntimeError):
        m.release("b")  # b has no pins left


def test_eviction_spares_adapters_with_queued_work():
    b = Backing()
    m = b.manager(max_loras=2)
    m.acquire("a"), m.acquire("b")  # a is least recently used
    assert m.acquire("c", keep={"a"}) == m.resident["c"] and m.slot_of("a") is not None
    assert m.slot_of("b") is None
    m.acquire("d", keep={"a", "c"})  # everyone kept: fall back to plain LRU
    assert m.slot_of("a") is None


def test_host_cache_serves_reloads_without_disk():
    b = Backing()
    m = b.manager(max_loras=1, max_cpu_loras=2)
    for name in ["a", "b", "a", "b", "c", "a"]:
        m.acquire(name)
    # a, b read once each; c read and pushes out b's copy (b sits in the slot), not a's, so the last a is a hit
    assert b.disk_reads == ["a", "b", "c"]
    assert m.cpu_loads == 3 and m.cpu_hits == 3 and m.loads == 6 and m.evictions == 5
    m.warm("c")  # host cache holds a, c: no read
    assert m.cpu_loads == 3
    m.warm("b")  # read from disk (pushing out a's copy: a is in the slot); the next acquire of b is a hit
    m.acquire("b")
    assert b.disk_reads[-1] == "b" and m.cpu_loads == 4 and m.cpu_hits == 4


def test_failed_load_changes_nothing():
    b = Backing(fail={"bad"})
    m = b.manager(max_loras=1)
    m.acquire("a")
    with pytest.raises(AdapterError):
        m.acquire("bad")
    assert m.resident == {"a": 0} and b.slots == {0: "a"} and m.evictions == 0


def test_ten_adapters_two_slots_counters():
    b = Backing()
    m = b.manager(max_loras=2, max_cpu_loras=10)
    names = [f"a{i}" for i in range(10)]
    for _ in range(3):
        for n in names:
            s = m.acquire(n)
            m.retain(n)
            assert b.slots[s] == n
            m.release(n)
    assert m.loads == 30 and m.hits == 0 and m.evictions == 28
    assert m.adapter_loads == {n: 3 for n in names}
    assert m.cpu_loads == 10 and m.cpu_hits == 20  # disk once per adapter, then the host cache
    assert len(b.slots) == 2
    st = m.stats()
    assert st["loads"] == 30 and st["adapter_loads"]["a3"] == 3


def test_block_manager_grows_and_frees():
    bm = BlockManager(num_blocks=5, block_size=4)
    s1, s2 = make_seq(0, None, 3, 4), make_seq(1, None, 3, 4)
    assert bm.blocks_needed(s1, 9) == 3 and bm.can_allocate(s1, 9)
    bm.allocate(s1, 9)
    assert len(s1.block_table) == 3 and bm.num_free_blocks == 2
    bm.allocate(s1, 12)  # still 3 blocks
    assert len(s1.block_table) == 3
    assert not bm.can_allocate(s2, 9) and bm.can_allocate(s2, 8) and not bm.can_allocate(s2, 8, reserve=1)
    bm.allocate(s2, 8)
    assert set(s1.block_table).isdisjoint(s2.block_table) and bm.num_free_blocks == 0
    with pytest.raises(RuntimeError):
        bm.allocate(s2, 9)
    bm.free(s1)
    assert s1.block_table == [] and bm.num_free_blocks == 3 and bm.num_used_blocks == 2


def test_prefetch_reads_in_background_and_counts_once():
    import threading

    b = Backing(fail={"bad"})
    main = threading.get_ident()
    threads = []

    def load_cpu(name):
        threads.append(threading.get_ident())
        return b.load_cpu(name)

    m = SlotManager(2, 4, load_cpu, b.install, b.evict, prefetch_threads=1)
    try:
        m.prefetch(["a", "b", "a", "bad"])
        assert m.prefetches == 2  # a, b (capped at max_loras in flight; duplicates skipped)
        assert m.acquire("a") == 0 and m.acquire("b") == 1
        assert threads and all(t != main for t in threads)
        assert m.cpu_loads == 2 and b.disk_reads == ["a", "b"]
        m.prefetch(["a", "bad"])  # a is resident: only bad is read
        with pytest.raises(AdapterError):
            m.acquire("bad")  # the background failure surfaces where the adapter is needed
        assert m.resident == {"a": 0, "b": 1}
    finally:
        m.close()


def test_scheduler_prefetches_the_next_adapters():
    from multilora_cli.config import EngineConfig
    from tests.engine.engine_sim import Sim

    sim = Sim(EngineConfig(model="m", max_loras=2, max_num_seqs=2, block_size=4), num_blocks=100, prefetch_threads=1)
    try:
        seqs = [make_seq(i, f"a{i % 5}", 4, max_tokens=3) for i in range(20)]
        done = sim.run(seqs)
        assert len(done) == 20 and all(s.error is None for s in done)
        st = sim.slots.stats()
        assert st["prefetches"] >= 3 and st["cpu_loads"] == 5  # every adapter read once, mostly ahead of time
    finally:
        sim.slots.close()


def test_acquire_without_wait_defers_an_adapter_still_being_read():
    import threading

    gate = threading.Event()

    def load(name):
        if name == "slow":
            assert gate.wait(30)
        return name

    m = SlotManager(2, 4, load, lambda *a: None, prefetch_threads=1)
    try:
        assert m.acquire("slow", wait=False) is None  # read started in the background, not waited for
        assert m.prefetches == 1 and m.not_ready == 1
        assert m.acquire("slow", wait=False) is None  # still reading: still deferred, not read twice
        assert m.prefetches == 1
        gate.set()
        m._inflight["slow"].result()
        assert m.acquire("slow", wait=False) == 0 and m.cpu_loads == 1
    finally:
        gate.set()
        m.close()


def test_scheduler_keeps_running_other_work_while_an_adapter_loads():
    import threading

    from multilora_cli.config import EngineConfig
    from tests.engine.engine_sim import Sim, expected_output

    gate = threading.Event()
    sim = Sim(
        EngineConfig(model="m", max_loras=2, max_num_seqs=4, block_size=4),
        num_blocks=100,
        prefetch_threads=1,
        gates={"slow": gate},
    )
    try:
        seqs = [
            make_seq(0, None, 4, max_tokens=6),
            make_seq(1, "slow", 4, max_tokens=3),
            make_seq(2, "fast", 4, max_tokens=6),
        ]
        for s in seqs:
            sim.sched.add(s)
        for _ in range(3):  # base + fast run; slow is deferred, not waited for
            b = sim.step()
            assert b is not None and all(s.adapter != "slow" for s in b.seqs)
        assert sim.slots.not_ready >= 1
        gate.set()
        done = sim.run([])
        assert sorted(s.seq_id for s in done) == [0, 1, 2]
        assert all(s.output_token_ids == expected_output(s) for s in done)
    finally:
        gate.set()
        sim.slots.close()


def test_pool_size_does_not_grow_reads_ahead_or_victim_search():
    """Issue 38: what a step does for prefetching and eviction is bounded by the wave (read_ahead), not the pool."""
    import threading

    gate = threading.Event()
    reads = []

    def load(name):
        reads.append(name)
        assert gate.wait(30)
        return name

    for pool in (8, 1000):
        m = SlotManager(pool, pool, load, lambda *a: None, prefetch_threads=1, read_ahead=4)
        m.prefetch([f"a{i}" for i in range(50)])
        assert len(m._inflight) == min(pool, 4) == m.read_ahead
        gate.set()
        m.close()
        gate.clear()
    # eviction: the least recently used unpinned adapter, found without walking the pinned ones
    m = SlotManager(3, 3, lambda n: n, lambda *a: None)
    for n in ("a", "b", "c"):
        m.acquire(n)
        m.retain(n)
    m.release("b")
    m.release("a")  # a is now the most recently used of the unpinned
    assert list(m._idle) == ["b", "a"]
    m.acquire("d")
    assert set(m.resident) == {"a", "c", "d"} and m.is_pinned("c")
    m.acquire("e", keep={"a"})  # d is newer than a, but a has queued work
    assert set(m.resident) == {"a", "c", "e"}


def test_preload_takes_only_read_adapters_and_never_displaces_queued_work():
    b = Backing()
    m = b.manager(max_loras=3, max_cpu_loras=8)
    for name in ("a", "b", "c", "d"):
        m.warm(name)  # read into the host cache (as the prefetch threads leave them)
    m.acquire("a")
    m.retain("a")  # running: pinned
    assert m.preload(["x", "b", "c", "d"], limit=1) == 1  # x is not read: skipped, never read here
    assert m.is_resident("b") and not m.is_resident("x") and b.disk_reads == ["a", "b", "c", "d"]
    # c takes the free slot; then b (kept) and c (on the list) are the idle ones: d waits
    assert m.preload(["b", "c", "d"], keep={"b"}, limit=5) == 1
    assert m.is_resident("c") and not m.is_resident("d") and m.is_resident("b")
    assert m.preload(["d"], keep={"c"}) == 1  # b has no queued work now: d takes its slot
    assert m.resident.keys() == {"a", "c", "d"} and m.is_pinned("a")
    loads = m.loads
    assert m.acquire("d") == m.slot_of("d") and m.loads == loads  # the admission then hits
    assert m.preloads == 3 and m.stats()["preloads"] == 3


def test_preload_fires_for_an_adapter_read_in_the_background():
    """Issue 38: a prefetched read waits in flight until an acquire claims it; preload must count a finished one as
    read (it saw only the host cache before, so it never fired in a run: 0 preloads at 1,000 adapters)."""
    b = Backing(fail={"bad"})
    m = SlotManager(4, 8, b.load_cpu, b.install, b.evict, prefetch_threads=1)
    try:
        m.prefetch(["a", "bad"])
        for fut in list(m._inflight.values()):
            fut.exception()  # wait for both reads (one fails)
        assert m.preload(["bad", "a"], limit=2) == 1  # a failed read is left for its admission to report
        assert m.is_resident("a") and not m.is_resident("bad") and m.preloads == 1
        assert b.disk_reads == ["a"] and m.cpu_loads == 1  # read once, on the worker
        loads = m.loads
        assert m.acquire("a") == m.slot_of("a") and m.loads == loads  # the admission hits
        with pytest.raises(AdapterError):
            m.acquire("bad")
    finally:
        m.close()


def test_every_adapter_with_a_slot_loads_once_never_evicts_and_preloads_fire():
    """Issue 38: with slots for every adapter nothing is evicted (the 375 evictions of the 1,000-slot bench row were
    its warm-up's adapters holding 512 slots), and the engine's per-step `Scheduler.preload` loads read adapters
    ahead of their admission, which then hits."""
    from multilora_cli.config import EngineConfig
    from tests.engine.engine_sim import Sim, expected_output

    sim = Sim(EngineConfig(model="m", max_loras=12, max_num_seqs=4, block_size=4), num_blocks=200, prefetch_threads=1)
    try:
        seqs = [make_seq(i, f"a{i % 10}", 4, max_tokens=3) for i in range(40)]
        for s in seqs:
            sim.sched.add(s)
        while sim.sched.has_unfinished():
            sim.step()
            for fut in list(sim.slots._inflight.values()):
                fut.result()  # the reads the step started are done by the time the next one runs
            sim.sched.preload(2)  # as Engine.generate does beside a running step (CUDA)
        st = sim.slots.stats()
        assert st["evictions"] == 0 and st["loads"] == 10 and st["cpu_loads"] == 10
        assert st["preloads"] >= 5  # most adapters were in a slot before their first admission
        assert sorted(s.seq_id for s in sim.finished) == list(range(40))
        assert all(s.output_token_ids == expected_output(s) for s in sim.finished)
    finally:
        sim.slots.close()


def test_evict_idle_frees_every_unpinned_slot():
    b = Backing()
    m = b.manager(max_loras=3, max_cpu_loras=4)
    for name in ("a", "b", "c"):
        m.acquire(name)
    m.retain("b")
    assert m.evict_idle() == 2 and m.resident == {"b": 1} and b.slots == {1: "b"}
    m.acquire("d")
    m.acquire("e")
    assert m.evictions == 2 and b.disk_reads == ["a", "b", "c", "d", "e"]  # free slots again: nothing evicted


def test_finished_reads_stop_holding_the_read_ahead():
    """Issue 38: done reads waiting for their admission held `read_ahead`, so the next adapters' reads could not
    start and their admissions read on the step loop's thread; now they move to the host cache."""
    b = Backing()
    m = SlotManager(8, 8, b.load_cpu, b.install, b.evict, prefetch_threads=1, read_ahead=2)
    try:
        m.prefetch(["a", "b"])
        for fut in list(m._inflight.values()):
            fut.result()
        m.prefetch(["a", "b", "c", "d"])  # a and b are read: c and d start
        assert m.prefetches == 4
        for fut in list(m._inflight.values()):
            fut.result()
        for name in ("c", "a", "d", "b"):
            m.acquire(name)
        assert m.caller_reads == 0 and m.cpu_loads == 4 and sorted(b.disk_reads) == ["a", "b", "c", "d"]
    finally:
        m.close()


def test_done_reads_wait_in_flight_rather_than_push_each_other_out():
    """Issue 37: claiming every finished read into a full host cache dropped the first ones (the next
    admissions'), which the step loop then read again; now what the cache has no room for stays in flight."""
    b = Backing()
    m = SlotManager(4, 2, b.load_cpu, b.install, b.evict, prefetch_threads=1, read_ahead=4)
    try:
        m.prefetch(["a", "b", "c", "d"])
        for fut in list(m._inflight.values()):
            fut.result()
        m.prefetch(["a", "b", "c", "d", "e"])  # a, b claimed into the cache; c, d wait in flight; e starts
        assert list(m._cpu) == ["a", "b"] and set(m._inflight) == {"c", "d", "e"}
        for fut in list(m._inflight.values()):
            fut.result()
        for name in ("a", "b", "c", "d"):
            m.acquire(name)
        assert m.caller_reads == 0 and sorted(b.disk_reads) == ["a", "b", "c", "d", "e"]
    finally:
        m.close()


def test_a_full_host_cache_keeps_the_copies_that_wait_for_a_load():
    """Issue 37: past the cache's size a copy of an adapter in a slot goes first, then the copy of the adapter
    being loaded now, never one that waits for its load (the next admissions' reads: dropped, they were read
    again on the step loop's thread)."""
    b = Backing()
    m = b.manager(max_loras=3, max_cpu_loras=2)
    m.warm("a")
    m.warm("b")
    m.acquire("c")  # a and b wait for their loads: c's own copy is not kept
    assert list(m._cpu) == ["a", "b"]
    m.acquire("a")
    m.acquire("b")
    assert b.disk_reads == ["a", "b", "c"] and m.caller_reads == 3 and m.cpu_hits == 2
    m.warm("d")  # a full cache of slotted copies: a's (least recently used) goes
    assert list(m._cpu) == ["b", "d"]


def test_refuse_frees_the_slot_and_the_host_copy_and_raises_after():
    """An adapter found broken after its load (the device's NaN check): its slot is free again, its host copy
    gone, and every later acquire raises that error without reading; refusing one still pinned is a bug."""
    b = Backing()
    m = b.manager(max_loras=2)
    sa = m.acquire("a")
    m.acquire("b")
    m.retain("a")
    err = AdapterError("adapter 'a': NaN")
    with pytest.raises(RuntimeError, match="still pin it"):
        m.refuse("a", err)
    m.release("a")
    m.refuse("a", err)
    assert m.slot_of("a") is None and sa not in b.slots and m.name_in(sa) is None
    with pytest.raises(AdapterError) as e:
        m.acquire("a")
    assert e.value is err and b.disk_reads == ["a", "b"]
    assert m.acquire("c") == sa  # the freed slot, without evicting b
    assert m.name_in(sa) == "c" and m.slot_of("b") is not None


def test_a_refused_adapter_is_not_read_or_staged_again():
    """Later lines of a refused adapter name it among the next admissions: no background read, no device copy,
    and a read that was in flight when it was refused is dropped when claimed, not kept in the host cache."""
    import threading

    gate = threading.Event()
    staged = []
    b = Backing()
    slow = b.load_cpu

    def load_cpu(name):
        if name == "x":
            assert gate.wait(10)
        return slow(name)

    m = SlotManager(
        2, 2, load_cpu, b.install, b.evict, prefetch_threads=1, stage=staged.append, stage_ahead=2, read_ahead=1
    )
    try:
        m.prefetch(["x"])  # in flight when x is refused
        err = AdapterError("adapter 'x': NaN")
        m.refuse("x", err)
        gate.set()
        m.prefetch(["x"])
        with pytest.raises(AdapterError):
            m.acquire("x")
        m._pool.submit(lambda: None).result()  # the read of x has finished
        m.prefetch(["y"])  # claims the finished reads (read_ahead reached)
        m._pool.submit(lambda: None).result()
        assert b.disk_reads.count("x") == 1 and "x" not in m._cpu and "x" not in m._inflight
        assert not any(o == ("weights", "x") for o in staged)
    finally:
        m.close()
