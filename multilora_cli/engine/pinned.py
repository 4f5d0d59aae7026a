"""`PinnedArena`: page-locked host memory registered ONCE, carved into the buffers packed adapters live in.

Why: a host->device copy from pageable memory blocks the calling thread for its whole length (~13 ms per
84 MB rank-16 Llama-3-8B adapter on an H200 host) and cannot overlap anything; from page-locked memory it is
an asynchronous DMA (~1.6 ms, the thread returns at once). But pinning a fresh buffer per adapter
(cudaHostAlloc through PyTorch's pinned allocator) stalled the running steps (7,951 vs 10,068 tok/s pageable).
So the engine registers one arena before the first step and packs adapters straight into blocks of it.

Registration is page-locking, and its cost is the pages: cudaHostRegister faults in and pins a fresh buffer 4 KiB
at a time (0.30-0.47 s per GiB on the H200 host, holding a driver lock that stalls every other thread's CUDA
calls meanwhile). So the arena is an anonymous mapping advised for transparent huge pages and pre-faulted by
writing it from all cores first: ~0.05 s per GiB in all.
Where huge pages are unavailable the pre-fault still runs in parallel (~0.1-0.19 s per GiB).

Blocks are first-fit ranges, aligned to 4 KiB. A block goes back when its owner dies (`weakref.finalize`
on the packed adapter), but is reused only once every device copy enqueued from it has run: whoever
enqueues one calls `block.record(stream)`. A full arena is not an error: `alloc` returns None and the
caller falls back to pageable memory. On CPU the arena is plain memory (the allocator is the same, tested).
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref

import torch

ALIGN = 4096


class PinnedBlock:
    """`nbytes` at `offset` of the arena; `tensor(numel, dtype)` views it; `record` marks a copy from it."""

    __slots__ = ("arena", "offset", "nbytes", "events")

    def __init__(self, arena: PinnedArena, offset: int, nbytes: int):
        self.arena, self.offset, self.nbytes = arena, offset, nbytes
        self.events: list = []

    def tensor(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.arena.buf[self.offset : self.offset + numel * dtype.itemsize].view(dtype)

    def memoryview(self) -> memoryview:
        """The block's bytes as a writable memoryview (no torch call: a reader thread can fill it by syscall)."""
        return self.arena.bytes[self.offset : self.offset + self.nbytes]

    def record(self, stream=None) -> None:
        """A device copy reading this block was just enqueued on `stream` (default: the current one)."""
        if self.arena.cuda:
            ev = torch.cuda.Event()
            ev.record(stream)
            with self.arena.lock:
                self.events = [e for e in self.events if not e.query()] + [ev]


class PinnedArena:
    """`nbytes` of host memory, page-locked on CUDA (cudaHostRegister); `alloc` hands out blocks of it."""

    def __init__(self, nbytes: int, *, cuda: bool):
        if nbytes < ALIGN:
            raise ValueError(f"PinnedArena needs at least {ALIGN} bytes, got {nbytes}")
        self.nbytes = nbytes - nbytes % ALIGN
        self.cuda = cuda
        self.buf, self._map = host_buffer(self.nbytes, prefault=cuda)
        self.bytes = memoryview(self.buf.numpy())  # the same memory, for os.preadv (engine/direct_read.py)
        self.registered = False
        if cuda:
            err = torch.cuda.cudart().cudaHostRegister(self.buf.data_ptr(), self.nbytes, 0)
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister of {self.nbytes / 2**30:.1f} GiB failed ({err})")
            self.registered = True
            # never free registered memory: the finalizer holds the buffer and its mapping until it unregisters
            self._finalizer = weakref.finalize(self, _unregister, self.buf, self._map)
        self.lock = threading.RLock()  # RLock: a finalizer may run on a thread that is inside alloc
        self._free: list[tuple[int, int]] = [(0, self.nbytes)]  # (offset, size), sorted, coalesced
        self._pending: list[PinnedBlock] = []  # owners gone, device copies maybe still running
        self.allocs = self.fallbacks = 0
        self.peak = self.used = 0

    def alloc(self, nbytes: int) -> PinnedBlock | None:
        """A block of at least `nbytes`, or None when none fits; `adopt` it to the object holding its views."""
        size = -(-max(nbytes, 1) // ALIGN) * ALIGN
        with self.lock:
            self._reclaim()
            for i, (off, sz) in enumerate(self._free):
                if sz >= size:
                    if sz == size:
                        del self._free[i]
                    else:
                        self._free[i] = (off + size, sz - size)
                    self.allocs += 1
                    self.used += size
                    self.peak = max(self.peak, self.used)
                    return PinnedBlock(self, off, size)
            self.fallbacks += 1
            return None

    def adopt(self, block: PinnedBlock, owner: object) -> None:
        """Release `block` when `owner` (which holds views of it) is garbage-collected."""
        weakref.finalize(owner, self.release, block)

    def release(self, block: PinnedBlock) -> None:
        """The block's owner is gone; it becomes free once the copies recorded on it have run (checked by the
        next `alloc`). Only queues it: a finalizer may run inside `alloc`, which must not see `_free` change."""
        with self.lock:
            self._pending.append(block)

    def _reclaim(self) -> None:
        pending, self._pending = self._pending, []
        keep = []
        for b in pending:
            if all(e.query() for e in b.events):
                self._insert(b.offset, b.nbytes)
                self.used -= b.nbytes
            else:
                keep.append(b)
        self._pending += keep  # blocks released meanwhile (a finalizer inside this loop) stay queued too

    def _insert(self, off: int, size: int) -> None:
        free = self._free
        i = 0
        while i < len(free) and free[i][0] < off:
            i += 1
        free.insert(i, (off, size))
        if i + 1 < len(free) and off + size == free[i + 1][0]:  # merge with the next range
            free[i] = (off, size + free[i + 1][1])
            del free[i + 1]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == off:  # and with the previous one
            free[i - 1] = (free[i - 1][0], free[i - 1][1] + free[i][1])
            del free[i]

    @property
    def free_bytes(self) -> int:
        with self.lock:
            self._reclaim()
            return sum(sz for _, sz in self._free)

    def stats(self) -> dict:
        return {
            "arena_bytes": self.nbytes,
            "pinned": self.registered,
            "blocks": self.allocs,
            "fallbacks": self.fallbacks,
            "peak_bytes": self.peak,
        }

    def close(self) -> None:
        """Unregister the memory: blocks still in use stay valid, as pageable memory."""
        if self.registered:
            self._finalizer()
            self.registered = False


def _unregister(buf: torch.Tensor, _mapping) -> None:
    torch.cuda.synchronize()  # no DMA may still read it
    torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())


def host_buffer(nbytes: int, *, prefault: bool) -> tuple[torch.Tensor, mmap.mmap | None]:
    """`nbytes` of zeroed host memory as a uint8 tensor, and the mapping behind it (keep it alive as long).

    An anonymous private mapping advised MADV_HUGEPAGE (2 MiB pages where the kernel grants them), written
    once when `prefault` so that every page exists before cudaHostRegister walks them. Falls back to
    torch.empty where mmap flags or madvise are missing (non-Linux)."""
    try:
        m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (AttributeError, OSError, ValueError):
        buf = torch.empty(nbytes, dtype=torch.uint8)
        if prefault:
            buf.zero_()
        return buf, None
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # THP off in this kernel: 4 KiB pages, still pre-faulted in parallel below
            pass
    buf = torch.frombuffer(m, dtype=torch.uint8)  # anonymous pages read as zero already
    if prefault:
        buf.fill_(0)  # fault every page in now, from torch's intra-op threads
    return buf, m


PINNED_HOST_FRACTION = 0.25  # at most this share of physical host memory is page-locked


def arena_bytes(adapter_bytes: list[int], max_cpu_loras: int, in_flight: int) -> int:
    """Size of the arena for adapters of these packed sizes: the host cache (`max_cpu_loras`) plus the reads
    that may be in flight (`in_flight`) of the largest ones, within PINNED_HOST_FRACTION of host memory."""
    if not adapter_bytes:
        return 0
    n = min(len(adapter_bytes), max_cpu_loras + in_flight)
    want = sum(-(-b // ALIGN) * ALIGN for b in sorted(adapter_bytes, reverse=True)[:n])
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 16 << 30
    return int(min(want, PINNED_HOST_FRACTION * phys))


def host_cache_capacity(arena_nbytes: int, adapter_bytes: int, max_cpu_loras: int, in_flight: int) -> int:
    """Adapters the host cache may keep when packed adapters of `adapter_bytes` (the largest) live in an arena of
    `arena_nbytes`: `max_cpu_loras`, unless the arena was capped below what the cache and the reads in flight
    need. Then the cache gives way, keeping half the blocks (up to `in_flight`) for the reads in flight.

    Why: an adapter that finds the arena full is packed into pageable memory instead, and those loads are slow
    (a synchronous copy, the pack on the caller's thread). A run with many slots filled the arena with adapters
    nobody would use again and loaded the rest that way: 256 adapters in 256 slots on an H200 host ran at
    5,401 tok/s against 12,000 in 64 slots."""
    size = -(-max(adapter_bytes, 1) // ALIGN) * ALIGN
    blocks = arena_nbytes // size
    if blocks >= max_cpu_loras + in_flight:
        return max_cpu_loras
    return max(1, min(max_cpu_loras, blocks - min(in_flight, blocks // 2)))


def reads_ahead_capacity(
    arena_nbytes: int, adapter_bytes: int, max_cpu_loras: int, in_flight: int, adapters: int
) -> int:
    """Reads in flight the arena has blocks for beside the host cache of `host_cache_capacity`: `in_flight` when
    the arena holds a block for each of the run's `adapters` (or for the cache and every read), else the blocks
    that cache leaves (at least 1). More reads than that were packed into pageable memory (slow loads), or,
    done before their admission, pushed reads that were waiting for theirs out of the host cache (issue 37: 20
    MoE reads of 1.7 GB ahead of a 20-block arena and a cache of 10)."""
    size = -(-max(adapter_bytes, 1) // ALIGN) * ALIGN
    blocks = arena_nbytes // size
    if blocks >= min(adapters, max_cpu_loras + in_flight):
        return in_flight
    cache = host_cache_capacity(arena_nbytes, adapter_bytes, max_cpu_loras, in_flight)
    return max(1, min(in_flight, blocks - cache))
