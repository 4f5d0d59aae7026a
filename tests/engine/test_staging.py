"""DeviceStager (engine/staging.py) and SlotManager's re-staging of cached adapters: the bookkeeping, on CPU
tensors (the same code runs on CUDA with a side stream and events; the GPU engine tests cover that path)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from multilora_cli.engine.slots import SlotManager
from multilora_cli.engine.staging import DeviceStager


@dataclass
class Packed:
    flat: torch.Tensor | None
    staged: tuple | None = None


def _packed(n, fill):
    return Packed(torch.full((n,), float(fill)))


def test_stage_take_release_round_trip():
    st = DeviceStager(torch.device("cpu"), numel=8, dtype=torch.float32, n_buffers=2)
    p = _packed(5, 3)
    assert st.stage(p) and p.staged is not None
    buf = st.take(p)
    assert buf is not None and torch.equal(buf[:5], p.flat) and p.staged is None
    assert st.take(p) is None  # taken once
    st.release(buf)
    assert st.stats() == {"staged": 1, "taken": 1, "reclaimed": 0, "skipped": 0}


def test_full_stager_reclaims_the_oldest_staged_never_blocks():
    st = DeviceStager(torch.device("cpu"), numel=4, dtype=torch.float32, n_buffers=2)
    a, b, c = _packed(4, 1), _packed(4, 2), _packed(4, 3)
    assert st.stage(a) and st.stage(b) and st.stage(c)  # c takes a's buffer back
    assert a.staged is None and st.take(a) is None
    assert torch.equal(st.take(c)[:4], c.flat) and torch.equal(st.take(b)[:4], b.flat)
    d = _packed(4, 4)
    assert not st.stage(d)  # both buffers taken and not released yet: skipped, not blocked
    assert st.stats()["reclaimed"] == 1 and st.stats()["skipped"] == 1


def test_taken_buffer_is_never_reclaimed_before_release():
    st = DeviceStager(torch.device("cpu"), numel=4, dtype=torch.float32, n_buffers=1)
    a, b = _packed(4, 1), _packed(4, 2)
    st.stage(a)
    buf = st.take(a)
    assert not st.stage(b)
    st.release(buf)
    assert st.stage(b) and torch.equal(st.take(b)[:4], b.flat)


@pytest.mark.parametrize("flat", [torch.zeros(9), torch.zeros(4, dtype=torch.float16), None])
def test_unfit_adapters_are_skipped(flat):
    st = DeviceStager(torch.device("cpu"), numel=8, dtype=torch.float32, n_buffers=1)
    assert not st.stage(Packed(flat)) and st.stats()["skipped"] == 1


def test_slot_manager_restages_cached_adapters_ahead_of_their_load():
    st = DeviceStager(torch.device("cpu"), numel=4, dtype=torch.float32, n_buffers=2)
    objs = {n: _packed(4, i) for i, n in enumerate("abcd")}
    installed = []

    def install(slot, name, obj):
        buf = st.take(obj)
        installed.append((name, buf is not None))
        if buf is not None:
            st.release(buf)

    sm = SlotManager(
        1, 8, load_cpu=objs.__getitem__, install=install, prefetch_threads=1, stage=st.stage, stage_ahead=2
    )
    try:
        for n in "abcd":
            sm.warm(n)  # all four read into the host cache, none staged
        sm.prefetch(["b", "c", "d"])  # only the next two get a device copy
        for f in list(sm._staging.values()):
            f.result()
        assert objs["b"].staged is not None and objs["c"].staged is not None and objs["d"].staged is None
        sm.acquire("b")
        sm.release("b") if sm.is_pinned("b") else None
        sm.acquire("d")
        assert installed == [("b", True), ("d", False)]
    finally:
        sm.close()


def test_slot_manager_stages_the_next_loads_right_after_reading_them():
    st = DeviceStager(torch.device("cpu"), numel=4, dtype=torch.float32, n_buffers=2)
    objs = {n: _packed(4, i) for i, n in enumerate("abc")}
    sm = SlotManager(
        4, 8, load_cpu=objs.__getitem__, install=lambda *a: None, prefetch_threads=1, stage=st.stage, stage_ahead=2
    )
    try:
        sm.prefetch(["a", "b", "c"])  # none read yet: three reads, the first two chained to a device copy
        sm.prefetch(["a", "b", "c"])  # asked again next step: nothing submitted twice
        for f in list(sm._staging.values()):
            f.result()
        assert [objs[n].staged is not None for n in "abc"] == [True, True, False]
        assert sm.prefetches == 3 and st.stats()["staged"] == 2
    finally:
        sm.close()


def test_staging_buffer_count_follows_the_memory_budget():
    from multilora_cli.engine.runner_sizing import staging_buffers

    assert staging_buffers(84 << 20) == 8  # rank-16 Llama-3-8B slot: the cap
    assert staging_buffers(336 << 20) == 3  # rank 64: what fits in 1 GiB
    assert staging_buffers(4 << 30) == 2  # never fewer than two
