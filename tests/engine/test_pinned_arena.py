"""PinnedArena: the block allocator packed adapters live in (CPU: the same allocator over plain memory)."""

import gc

import pytest
import torch

from multilora_cli.engine.packed import pack_adapter
from multilora_cli.engine.pinned import ALIGN, PinnedArena, arena_bytes, host_cache_capacity, reads_ahead_capacity
from multilora_cli.engine.slots import SlotManager
from tests.engine.test_engine_packed import SHAPES, _adapter


def test_alloc_first_fit_aligned_and_full_arena_falls_back():
    arena = PinnedArena(10 * ALIGN, cuda=False)
    a, b = arena.alloc(1), arena.alloc(ALIGN + 1)  # rounded up to whole pages
    assert (a.offset, a.nbytes, b.offset, b.nbytes) == (0, ALIGN, ALIGN, 2 * ALIGN)
    c = arena.alloc(7 * ALIGN)
    assert c.offset == 3 * ALIGN and arena.free_bytes == 0
    assert arena.alloc(1) is None and arena.stats()["fallbacks"] == 1
    arena.release(b)  # a hole of 2 pages between a and c: first fit takes it
    assert arena.alloc(3 * ALIGN) is None
    d = arena.alloc(2 * ALIGN)
    assert d.offset == ALIGN


def test_release_coalesces_neighbours():
    arena = PinnedArena(8 * ALIGN, cuda=False)
    blocks = [arena.alloc(2 * ALIGN) for _ in range(4)]
    for i in (0, 2, 1, 3):  # frees out of order must merge back into one range
        arena.release(blocks[i])
    assert arena._free == [] and len(arena._pending) == 4  # queued: only alloc / free_bytes reclaim
    assert arena.free_bytes == 8 * ALIGN and arena._free == [(0, 8 * ALIGN)]
    assert arena.alloc(8 * ALIGN).offset == 0


def test_block_views_do_not_overlap():
    arena = PinnedArena(4 * ALIGN, cuda=False)
    a, b = arena.alloc(ALIGN), arena.alloc(ALIGN)
    ta, tb = a.tensor(ALIGN // 4, torch.float32), b.tensor(ALIGN // 2, torch.bfloat16)
    ta.fill_(1.0)
    tb.fill_(2.0)
    assert bool((ta == 1.0).all()) and bool((tb == 2.0).all())


def test_packed_adapter_lives_in_the_arena_and_gives_its_block_back():
    adapter = _adapter("u", {m: 8 for m in SHAPES})
    numel = sum(m.a.numel() + m.b.numel() for m in adapter.modules.values())
    arena = PinnedArena(2 * numel * 4 + 4 * ALIGN, cuda=False)
    free0 = arena.free_bytes
    p = pack_adapter(adapter, pin=False, arena=arena)
    assert p.block is not None and p.flat.data_ptr() == arena.buf.data_ptr() + p.block.offset
    for key, m in adapter.modules.items():  # contents identical to the source
        assert torch.equal(p.modules[key].a, m.a) and torch.equal(p.modules[key].b, m.b)
    q = pack_adapter(adapter, pin=False, arena=arena)
    assert q.block.offset >= p.block.offset + p.block.nbytes  # two live adapters, two blocks
    third = pack_adapter(adapter, pin=False, arena=arena)  # no room left: ordinary memory, same contents
    assert third.block is None and torch.equal(third.flat, p.flat)
    del p, q
    gc.collect()
    assert arena.free_bytes == free0  # owners gone: both blocks back, merged


@pytest.mark.parametrize(
    "sizes,cpu,slots,want",
    [
        ([100, 5000, 3000], 64, 8, 4 * ALIGN),  # fewer adapters than cache: all of them, page-rounded
        ([ALIGN] * 10, 2, 1, 3 * ALIGN),  # cache + reads in flight of the largest
        ([], 4, 4, 0),
    ],
)
def test_arena_bytes(sizes, cpu, slots, want):
    assert arena_bytes(sizes, cpu, slots) == want


def test_arena_bytes_capped_by_host_memory():
    import os

    phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert arena_bytes([phys] * 4, 4, 4) <= phys // 4


@pytest.mark.parametrize("prefault", [False, True])
def test_host_buffer_is_zeroed_writable_memory_of_the_asked_size(prefault):
    from multilora_cli.engine.pinned import host_buffer

    n = 3 * (2 << 20) + ALIGN  # not a whole number of huge pages
    buf, mapping = host_buffer(n, prefault=prefault)
    assert buf.dtype == torch.uint8 and buf.numel() == n and not buf.any()
    buf[-1] = 7  # the last byte exists and belongs to this buffer
    if mapping is not None:  # Linux: the tensor is a view of the mapping, not a copy
        assert mapping[n - 1] == 7
    arena = PinnedArena(n, cuda=False)
    assert arena.buf.numel() == n - n % ALIGN


@pytest.mark.parametrize(
    "blocks,cpu,slots,want",
    [
        (16, 8, 8, 8),  # the arena holds cache + reads in flight: the cache as asked
        (100, 8, 8, 8),
        (12, 8, 8, 6),  # capped: half the blocks stay for the reads in flight
        (12, 8, 2, 8),  # 12 - 2 >= 8
        (12, 9, 2, 9),  # 12 - 2 = 10 >= 9
        (402, 512, 256, 201),  # the H200 row of 256 adapters in 256 slots (33.8 GB arena, 84 MB adapters)
        (1, 64, 64, 1),  # never below one
    ],
)
def test_host_cache_capacity(blocks, cpu, slots, want):
    size = 3 * ALIGN + 5  # page-rounded to 4 pages
    assert host_cache_capacity(blocks * 4 * ALIGN + ALIGN - 1, size, cpu, slots) == want


@pytest.mark.parametrize(
    "blocks,cpu,slots,adapters,want",
    [
        (16, 8, 8, 100, 8),  # room for cache + reads: every read a wave ahead
        (12, 8, 8, 100, 6),  # capped: the cache keeps 6, the reads get the other 6
        (12, 8, 2, 100, 2),  # never more than asked
        (20, 20, 20, 64, 10),  # the MoE row of issue 37: 20 blocks of 1.7 GB, 20 slots: 10 cached, 10 read ahead
        (3, 64, 3, 3, 3),  # a block for every adapter (a small run): nothing to hold back
        (1, 64, 64, 100, 1),  # never below one
    ],
)
def test_reads_ahead_capacity(blocks, cpu, slots, adapters, want):
    """Reads in flight never need more blocks than the cache leaves: cache + reads <= blocks when capped."""
    size = 3 * ALIGN + 5
    nbytes = blocks * 4 * ALIGN + ALIGN - 1
    got = reads_ahead_capacity(nbytes, size, cpu, slots, adapters)
    assert got == want
    if blocks < min(adapters, cpu + slots) and blocks > 1:
        assert host_cache_capacity(nbytes, size, cpu, slots) + got <= blocks


@pytest.mark.parametrize("capped", [False, True])
def test_a_host_cache_sized_to_the_arena_keeps_loads_in_the_arena(capped):
    """More adapters pass through the slots than the arena holds: with the cache capped to the arena, LRU
    evictions give blocks back and every load is packed in the arena; with the cache as asked, loads past the
    arena fall back to ordinary memory (the slow path on CUDA)."""
    adapters = {f"a{i}": _adapter(f"a{i}", {m: 4 for m in SHAPES}, seed=i) for i in range(12)}
    nbytes = pack_adapter(adapters["a0"], pin=False).flat.numel() * 4
    arena = PinnedArena(6 * (-(-nbytes // ALIGN) * ALIGN), cuda=False)
    cpu, slots = 8, 2
    cap = host_cache_capacity(arena.nbytes, nbytes, cpu, slots) if capped else cpu
    assert cap == (4 if capped else 8)
    installed = {}
    mgr = SlotManager(
        slots,
        cap,
        load_cpu=lambda n: pack_adapter(adapters[n], pin=False, arena=arena),
        install=lambda slot, n, obj: installed.__setitem__(slot, (n, obj.flat.clone())),
    )
    for i in range(12):
        name = f"a{i}"
        slot = mgr.acquire(name)
        gc.collect()
        assert installed[slot][0] == name
        ref = pack_adapter(adapters[name], pin=False).flat
        assert torch.equal(installed[slot][1], ref)  # the weights that went in are the adapter's
    assert (arena.stats()["fallbacks"] == 0) == capped
