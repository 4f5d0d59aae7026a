"""`SlotManager`: which adapter sits in which of the `max_loras` GPU slots, plus a host-side LRU cache.

Pure bookkeeping; the callbacks do the tensor work:
- `load_cpu(name) -> obj` reads an adapter from disk into host memory (pinned tensors, say),
- `install(slot, name, obj)` copies it into every LoRA layer's slot `slot`,
- `evict(slot, name)` (optional) forgets the adapter that was there.

Adapters used by RUNNING sequences are pinned (`retain` / `release` refcounts) and never evicted, so a step can
never see more than `max_loras` distinct adapters. Unpinned resident adapters stay in their slot (a later request
for them is a hit) until a miss needs the slot: then the least recently used unpinned one is evicted. The base
model (`None`) never takes a slot: its slot is -1.

With `prefetch_threads > 0`, `prefetch(names)` starts `load_cpu` for adapters needed soon on a background thread
(the scheduler names them each step), so disk reads overlap GPU compute; `load_cpu` must then be thread-safe.
All bookkeeping stays on the caller's thread: the worker only runs `load_cpu`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from multilora_cli.errors import MultiloraError

BASE_SLOT = -1


class SlotManager:
    """Adapter name -> GPU slot, LRU eviction of unpinned adapters, LRU host cache of `max_cpu_loras` objects."""

    def __init__(
        self,
        max_loras: int,
        max_cpu_loras: int,
        load_cpu: Callable[[str], object],
        install: Callable[[int, str, object], None],
        evict: Callable[[int, str], None] | None = None,
        prefetch_threads: int = 0,
        stage: Callable[[object], bool] | None = None,
        stage_ahead: int = 0,
        read_ahead: int | None = None,
    ):
        if max_loras < 1 or max_cpu_loras < 0:
            raise ValueError(f"max_loras must be >= 1 and max_cpu_loras >= 0, got {max_loras}, {max_cpu_loras}")
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        # background reads in flight at most: the next wave's adapters (the engine passes max_num_seqs), not the
        # pool: with 1,000 slots, 1,000 queued reads put the next admission's adapter behind reads for later ones
        self.read_ahead = max(1, min(max_loras, read_ahead if read_ahead is not None else max_loras))
        self._load_cpu = load_cpu
        self._install = install
        self._evict = evict
        self._slot_of: dict[str, int] = {}
        self._lru: OrderedDict[str, None] = OrderedDict()  # resident adapters, least recently used first
        # the unpinned ones among them, in the same order: a miss finds its victim here without walking the pinned
        # (O(1) but for skipped `keep` adapters, instead of O(resident) per miss)
        self._idle: OrderedDict[str, None] = OrderedDict()
        self._free_slots: list[int] = list(range(max_loras - 1, -1, -1))  # pop() hands out slot 0 first
        self._refs: dict[str, int] = {}  # running sequences per adapter (pins)
        self._cpu: OrderedDict[str, object] = OrderedDict()  # host cache, least recently used first
        self._inflight: dict[str, Future] = {}  # background reads not yet claimed
        self._refused: dict[str, MultiloraError] = {}  # adapters found broken after their load (`refuse`)
        # host-cached adapters get their device copy made ahead too (engine/staging.py), at most stage_ahead
        self._stage, self._stage_ahead = stage, stage_ahead
        self._staging: dict[str, Future] = {}
        self._pool = (
            ThreadPoolExecutor(prefetch_threads, thread_name_prefix="lora-prefetch") if prefetch_threads > 0 else None
        )
        # counters
        self.loads = 0  # installs into a GPU slot (misses)
        self.hits = 0  # acquire() found the adapter already resident
        self.evictions = 0
        self.cpu_loads = 0  # load_cpu calls (disk reads)
        self.cpu_hits = 0  # misses served from the host cache
        self.prefetches = 0  # background reads started
        self.caller_reads = 0  # reads made on the caller's thread (no background read of it had started)
        self.not_ready = 0  # acquire(wait=False) calls deferred because a read / device copy was in flight
        self.preloads = 0  # loads made by `preload`, ahead of the admission that then hits
        self.adapter_loads: dict[str, int] = {}
        self.read_wait_seconds = 0.0  # caller's time blocked on reads (in flight, or made on its own thread)

    # --- queries ---------------------------------------------------------------------------------------------
    def slot_of(self, name: str | None) -> int | None:
        """Slot of a resident adapter, -1 for the base model, None if not resident."""
        if name is None:
            return BASE_SLOT
        return self._slot_of.get(name)

    def is_resident(self, name: str | None) -> bool:
        return name is None or name in self._slot_of

    def is_pinned(self, name: str | None) -> bool:
        return name is not None and self._refs.get(name, 0) > 0

    def refcount(self, name: str | None) -> int:
        return 0 if name is None else self._refs.get(name, 0)

    @property
    def num_pinned(self) -> int:
        return len(self._refs)  # only resident adapters are pinned, and a pin count of 0 is deleted

    @property
    def resident(self) -> dict[str, int]:
        """Resident adapters and their slots, least recently used first."""
        return {n: self._slot_of[n] for n in self._lru}

    def can_acquire(self, name: str | None) -> bool:
        """Whether `acquire(name)` would return a slot (no side effects)."""
        if name is None or name in self._slot_of or self._free_slots:
            return True
        return len(self._refs) < len(self._slot_of)  # some resident adapter is unpinned (O(1): per admission)

    # --- transitions -----------------------------------------------------------------------------------------
    def acquire(self, name: str | None, keep: Container[str] = (), wait: bool = True) -> int | None:
        """Slot for `name`, loading it if needed; None when every slot is pinned by running sequences.

        Hit: refresh its LRU position. Miss: take a free slot, else evict the least recently used unpinned
        adapter, sparing those in `keep` (e.g. adapters with queued requests) while any other is evictable;
        the weights come from the host cache, else from `load_cpu` (which may raise: nothing changes).
        wait=False (the caller has other work to run): with prefetch threads, a miss whose read or device copy
        is still in flight returns None instead of blocking (the read is started if it was not), so the step
        loop keeps the GPU busy while adapters load; the caller retries next step.
        """
        if name is None:
            return BASE_SLOT
        if name in self._refused:
            raise self._refused[name].with_traceback(None)  # (each raise would chain its frames onto one object)
        if name in self._slot_of:
            self.hits += 1
            self._lru.move_to_end(name)
            if name in self._idle:
                self._idle.move_to_end(name)
            if name in self._cpu:
                self._cpu.move_to_end(name)
            return self._slot_of[name]
        if not self.can_acquire(name):
            return None
        if not wait and not self._ready(name):
            self.not_ready += 1
            return None
        obj = self._host_copy(name, loading=True)  # before evicting anything: a failed load leaves the slots intact
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            victim = next((n for n in self._idle if n not in keep), None) or next(iter(self._idle))
            slot = self._slot_of.pop(victim)
            del self._lru[victim]
            del self._idle[victim]
            self.evictions += 1
            if self._evict is not None:
                self._evict(slot, victim)
        try:
            self._install(slot, name, obj)
        except BaseException:
            self._free_slots.append(slot)
            raise
        self._staging.pop(name, None)
        self._slot_of[name] = slot
        self._lru[name] = None
        self._idle[name] = None
        self.loads += 1
        self.adapter_loads[name] = self.adapter_loads.get(name, 0) + 1
        return slot

    def name_in(self, slot: int) -> str | None:
        """The adapter resident in `slot` (None: none)."""
        return next((n for n, s in self._slot_of.items() if s == slot), None)

    def refuse(self, name: str, error: MultiloraError) -> None:
        """`name` turned out broken after it was loaded (a NaN / Inf the slot load's device check found): every
        later `acquire` raises `error`, its host copy goes, and its slot is freed. Its sequences must have been
        failed first (it holds no pins)."""
        if self._refs.get(name, 0):
            raise RuntimeError(f"refuse({name!r}): {self._refs[name]} running sequences still pin it")
        self._refused[name] = error.with_traceback(None)
        self._cpu.pop(name, None)
        self._staging.pop(name, None)  # (a read still in flight is dropped when it is claimed: `_claim_done`)
        if name in self._slot_of:
            self._free(name)

    def _ready(self, name: str) -> bool:
        """No background work pending for `name` (starting its read if nobody has yet)."""
        if self._pool is None:
            return True
        if name not in self._cpu:
            fut = self._inflight.get(name)
            if fut is None:
                self.prefetch([name])
                fut = self._inflight.get(name)
            # not started (read_ahead reads already in flight): read it now, on the caller's thread. Deferring it
            # as well was measured worse (admissions spread over more eager mixed steps)
            if fut is not None and not fut.done():
                return False
        staging = self._staging.get(name)  # the device copy chained after the read
        return staging is None or staging.done()

    def preload(self, names: Iterable[str], keep: Container[str] = (), limit: int = 1) -> int:
        """Install up to `limit` of `names` (the next admissions' adapters, in order) ahead of their admission, so
        that their loads run while a step is in flight rather than between steps (the engine calls this after
        launching a step; on CUDA a load goes on the slot writer's own stream). Only adapters whose host copy is
        at hand (in the host cache, or a finished background read) with no device copy in flight (never waits,
        never reads on this thread), and only into a free slot or in place of an unpinned adapter outside `keep`
        and `names` (one with queued work is never displaced). Returns how many were installed; a failing install
        is left for the admission to report."""
        names = list(names)
        keep = _Either(keep, set(names))  # nor one this very list is about to use
        done = 0
        for name in names:
            if done >= limit:
                break
            if name is None or name in self._slot_of or not self._read(name):
                continue
            staging = self._staging.get(name)
            if staging is not None and not staging.done():
                continue
            if not self._free_slots and next((n for n in self._idle if n not in keep), None) is None:
                break  # no slot to take without displacing queued work
            try:
                self.acquire(name, keep=keep)
            except (MultiloraError, ValueError):
                continue
            self.preloads += 1
            done += 1
        return done

    def _read(self, name: str) -> bool:
        """Whether `name`'s host copy is at hand without waiting: in the host cache, or its background read done
        (and not failed). A prefetched read stays in `_inflight` until an acquire claims it, so checking the
        host cache alone never saw one: `preload` fired only for adapters warmed by hand (issue 38: 0 preloads
        in the 1,000-adapter bench)."""
        if name in self._refused:
            return False
        if name in self._cpu:
            return True
        fut = self._inflight.get(name)
        return fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None

    def retain(self, name: str | None) -> None:
        """Pin a resident adapter for one more running sequence."""
        if name is None:
            return
        if name not in self._slot_of:
            raise RuntimeError(f"retain({name!r}): adapter is not in a slot (acquire it first)")
        n = self._refs.get(name, 0)
        if n == 0:
            self._idle.pop(name, None)
        self._refs[name] = n + 1

    def release(self, name: str | None) -> None:
        """Drop one pin; an adapter with no pins stays resident (and becomes the most recently used)."""
        if name is None:
            return
        n = self._refs.get(name, 0)
        if n <= 0:
            raise RuntimeError(f"release({name!r}) without a matching retain")
        if n == 1:
            del self._refs[name]
            if name in self._lru:
                self._idle[name] = None  # now evictable, the most recently used
        else:
            self._refs[name] = n - 1
        if name in self._lru:
            self._lru.move_to_end(name)

    def evict_idle(self) -> int:
        """Evict every unpinned resident adapter (host cache kept); returns how many. For a benchmark whose warm-up
        adapters would otherwise hold slots that the timed run's own adapters then evict (issue 38: 375 evictions
        in a 1,000-slot row whose 863 adapters all fit)."""
        n = 0
        for name in list(self._idle):
            self._free(name)
            n += 1
        return n

    def _free(self, name: str) -> None:
        """Evict the unpinned resident `name`; its slot goes back to the free list."""
        slot = self._slot_of.pop(name)
        del self._lru[name]
        del self._idle[name]
        self._free_slots.append(slot)
        self.evictions += 1
        if self._evict is not None:
            self._evict(slot, name)

    def warm(self, name: str) -> None:
        """Read an adapter into the host cache ahead of need, so a later miss does not wait on the disk."""
        if name in self._cpu:
            self._cpu.move_to_end(name)
        elif name not in self._slot_of:
            self._host_copy(name)

    @property
    def prefetching(self) -> bool:
        return self._pool is not None

    def prefetch(self, names: Iterable[str]) -> None:
        """Start background reads of adapters that are neither resident, cached nor already being read (at
        most `read_ahead` in flight), and device copies of the first `stage_ahead` of `names` (the next loads)
        once they are read. A no-op without prefetch threads."""
        if self._pool is None:
            return
        if len(self._inflight) >= self.read_ahead:
            self._claim_done()
        ahead = 0
        for name in names:
            if name is None or name in self._slot_of or name in self._refused:
                continue
            if name not in self._cpu and name not in self._inflight:
                if len(self._inflight) >= self.read_ahead:
                    break
                self._inflight[name] = self._pool.submit(self._load_cpu, name)
                self.prefetches += 1
            if self._stage is not None and ahead < self._stage_ahead:  # the next loads: device copy ahead too
                ahead += 1
                fut = self._staging.get(name)
                obj = self._cpu.get(name)
                if fut is None or (fut.done() and obj is not None and getattr(obj, "staged", None) is None):
                    src = self._inflight.get(name)
                    self._staging[name] = self._pool.submit(self._stage_loaded, name, obj, src)

    def _claim_done(self) -> None:
        """Move finished reads into the host cache, so they stop counting against `read_ahead`: unclaimed, they
        held it until their admission, and with 1,000 adapters a full set of done reads for later waves blocked
        the reads of the next admissions, which then read on the caller's thread (issue 38). A failed read
        stays, for its acquire to report. Without a host cache they stay too (nowhere else to keep them), and
        so do reads the cache has no room for: claiming one would drop a host copy of an adapter that is not in a
        slot, maybe a read made for the next admissions, which would then read it again on the caller's thread
        (issue 37: MoE adapters of 1.7 GB, a cache of 10, 20 reads ahead). Left in flight, they hold further
        reads back."""
        if self.max_cpu_loras <= 0:
            return
        for name, fut in list(self._inflight.items()):
            if name in self._refused and fut.done():  # read before it was refused: nothing will load it
                del self._inflight[name]
                continue
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                if len(self._cpu) >= self.max_cpu_loras and self._spare() is None:
                    return  # the cache is full of copies that wait for their loads
                del self._inflight[name]
                self._keep(name, fut.result())

    def _stage_loaded(self, name: str, obj: object | None, fut: Future | None) -> bool:
        """Worker: stage `obj`, or the result of the read `fut` once it is done (a failed read stages nothing, nor
        does one of an adapter refused meanwhile)."""
        if obj is None:
            try:
                obj = fut.result()
            except BaseException:  # noqa: BLE001 - the reader reports it when it claims the read
                return False
        if name in self._refused:
            return False
        return self._stage(obj)

    def close(self) -> None:
        """Stop the prefetch thread (waits for reads in flight)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._inflight.clear()
        self._staging.clear()

    def stats(self) -> dict:
        return {
            "loads": self.loads,
            "hits": self.hits,
            "evictions": self.evictions,
            "cpu_loads": self.cpu_loads,
            "cpu_hits": self.cpu_hits,
            "prefetches": self.prefetches,
            "caller_reads": self.caller_reads,
            "not_ready": self.not_ready,
            "preloads": self.preloads,
            "adapter_loads": dict(self.adapter_loads),
        }

    # --- host cache ------------------------------------------------------------------------------------------
    def _host_copy(self, name: str, loading: bool = False) -> object:
        if name in self._cpu:
            self.cpu_hits += 1
            self._cpu.move_to_end(name)
            return self._cpu[name]
        fut = self._inflight.pop(name, None)
        t0 = time.perf_counter()
        if fut is None:
            self.caller_reads += 1
        obj = fut.result() if fut is not None else self._load_cpu(name)  # a failed read raises here
        self.read_wait_seconds += time.perf_counter() - t0
        self._keep(name, obj, loading)
        return obj

    def _keep(self, name: str, obj: object, loading: bool = False) -> None:
        """A read's result (counted) into the host cache. Past `max_cpu_loras` a copy goes: the least recently
        used of an adapter in a slot, else the one of `name` when it is `loading` into a slot now, else the least
        recently used. Why: a copy of an adapter in a slot only serves a reload after an eviction, one of an
        adapter not in a slot waits for its load, maybe a read made for the next admissions (issue 37: a full
        cache dropped those, and the step loop read them again)."""
        self.cpu_loads += 1
        if self.max_cpu_loras > 0:
            self._cpu[name] = obj
            while len(self._cpu) > self.max_cpu_loras:
                spare = self._spare()
                if spare is None:
                    spare = name if loading else next(iter(self._cpu))
                del self._cpu[spare]

    def _spare(self) -> str | None:
        """The least recently used host copy of an adapter that is in a slot (None: every copy waits for a load)."""
        return next((n for n in self._cpu if n in self._slot_of), None)


class _Either:
    """In either of two containers (the `keep` of `SlotManager.preload`)."""

    __slots__ = ("a", "b")

    def __init__(self, a: Container, b: Container):
        self.a, self.b = a, b

    def __contains__(self, x: object) -> bool:
        return x in self.a or x in self.b
