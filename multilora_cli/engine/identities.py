"""`AdapterIdentities`: each adapter's prefix-cache identity, hashed on background threads in the order the
admissions will need them.

The prefix cache keys KV by what an adapter IS (adapters/identity.py: a content hash of its files, 3 MiB of reads
and hashing for a large weights file, ~3-4 ms). Hashed on the step loop's thread at each adapter's first request,
that was ~3 s of host time between steps in the 1,000-adapter bench (863 adapters first seen during the timed
run; issue 38). Here the hash is queued when the adapter's first request is fed and claimed when a request of it
is admitted (`PendingIdentity.get`). hashlib and file reads release the GIL, so the workers do not slow the step
loop either.

Order: the feed queues hashes in request order, but admission takes adapters in its own order (grouped loads,
admission.LoadPicker), so with 1,000 adapters of a request or two the next admissions' hashes sat behind hundreds
of others and were hashed on the step loop (`get` takes back a queued one rather than wait for the queue). The
scheduler therefore moves the next admissions' hashes to the front of the queue each time that order changes
(`hurry`, the same list its adapter reads are prefetched in), so they are hashed a wave ahead, as the reads are.
The engine queues every adapter's hash when it starts (`start_all`), so they are hashed while the model loads,
kernels compile and the host arena is page-locked, not at the first wave's admissions. `caller_hashes` /
`caller_seconds` count what was still hashed on the caller's thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

from multilora_cli.adapters.identity import adapter_identity


def _identity(path: Path) -> str | None:
    try:
        return f"lora:{adapter_identity(path)}"
    except OSError:
        return None  # unreadable: the adapter takes no part in the cache (its load fails the request anyway)


_QUEUED, _RUNNING, _DONE = range(3)


def identity_threads(prefetch_threads: int) -> int:
    """Hash workers for a run with `prefetch_threads` adapter readers (0: hash on the caller's thread). Twice as
    many: a run's first admission needs a wave of identities at once (~130 adapters at 1,000 adapters, 256
    seats), hashing lets go of the GIL, and in profile_scheduler (--hash-ms 4) 4 workers left 21 of them to the
    step loop where 2 left 37."""
    return 2 * prefetch_threads


class PendingIdentity:
    """An identity whose hash was queued for the workers. `get()` (the step loop, at admission): its value; one
    still queued is taken back and hashed on the spot (the admission waits for its own adapter's hash at most,
    never for the queue before it); one a worker is hashing is waited for."""

    __slots__ = ("_owner", "name", "path", "_state", "_value", "_event")

    def __init__(self, owner: AdapterIdentities, name: str, path: Path):
        self._owner, self.name, self.path = owner, name, path
        self._state = _QUEUED  # changed under the owner's lock only
        self._value: str | None = None
        self._event = threading.Event()

    def done(self) -> bool:
        return self._event.is_set()

    @staticmethod
    def hurry(pending: list[PendingIdentity]) -> None:
        """Hash these next, in this order, before the rest of their queues (`AdapterIdentities.hurry`)."""
        for owner in {id(p._owner): p._owner for p in pending}.values():  # (one per engine)
            owner.hurry(p for p in pending if p._owner is owner)

    def get(self) -> str | None:
        if not self._event.is_set():
            if self._owner._take(self):  # still queued: hash it here
                t0 = time.perf_counter()
                self._set(self._owner._hash(self.path))
                self._owner._count_caller(time.perf_counter() - t0)
            else:
                self._event.wait()
        return self._value

    def _set(self, value: str | None) -> None:
        self._value = value
        self._event.set()


class AdapterIdentities:
    """Adapter name -> "lora:<hash>" (None: unreadable). `start(name)` returns the identity if known, else a
    `PendingIdentity` (its hash queued on the workers). `hash_fn`: path -> identity (a profile's stand-in)."""

    def __init__(self, paths: dict[str, Path], threads: int = 2, hash_fn: Callable[[Path], str | None] = _identity):
        self._paths = paths
        self._threads = threads
        self._hash = hash_fn
        self._known: dict[str, str | None | PendingIdentity] = {}
        self._queue: OrderedDict[str, PendingIdentity] = OrderedDict()  # not started yet, next first
        self._cv = threading.Condition()
        self._workers: list[threading.Thread] = []
        self._closed = False
        self.caller_hashes = 0  # hashes made on the caller's thread (still queued when admitted)
        self.caller_seconds = 0.0

    def start(self, name: str) -> str | None | PendingIdentity:
        got = self._known.get(name, self)
        if isinstance(got, PendingIdentity) and got.done():
            got = self._known[name] = got.get()
        if got is not self:
            return got
        if self._threads <= 0:  # no workers: hash here
            got = self._known[name] = self._hash(self._paths[name])
            return got
        got = self._known[name] = PendingIdentity(self, name, self._paths[name])
        with self._cv:
            if self._closed:  # (never queued: `get` hashes it on the spot)
                return got
            self._queue[name] = got
            if len(self._workers) < self._threads:
                t = threading.Thread(target=self._work, name=f"lora-identity-{len(self._workers)}", daemon=True)
                self._workers.append(t)
                t.start()
            self._cv.notify()
        return got

    def start_all(self, names: Iterable[str]) -> None:
        """Queue the hash of each of `names` not known yet, in that order (the engine's start: with 1,000
        adapters, the first wave of admissions needs ~230 identities at once, and those the workers had not
        reached were hashed on the step loop, ~10 ms each on a GPU host). Without workers: nothing (each is
        hashed at its first request, as before)."""
        if self._threads <= 0:
            return
        for name in names:
            if name not in self._known:
                self.start(name)

    def hurry(self, pending: Iterable[PendingIdentity]) -> None:
        """Hash these next, in this order (the next admissions' adapters), before the rest of the queue."""
        with self._cv:
            q = self._queue
            for p in reversed(list(pending)):
                if p.name in q:
                    q.move_to_end(p.name, last=False)

    def queued(self) -> list[str]:
        """The names whose hash has not started, next first (tests, profiles)."""
        with self._cv:
            return list(self._queue)

    @staticmethod
    def resolve(value: str | None | PendingIdentity) -> str | None:
        """The identity `start` gave (hashing it now if no worker has started on it)."""
        return value.get() if isinstance(value, PendingIdentity) else value

    def close(self) -> None:
        """Stop the workers (waits for the hashes they are making); what is still queued is hashed by its `get`."""
        with self._cv:
            self._closed = True
            self._queue.clear()
            self._cv.notify_all()
        for t in self._workers:
            t.join()
        self._workers = []

    # --- workers and the caller's claims (under the lock) ----------------------------------------------------
    def _take(self, p: PendingIdentity) -> bool:
        """Claim a hash that no worker has started (True: the caller makes it)."""
        with self._cv:
            if p._state != _QUEUED:
                return False
            p._state = _RUNNING
            self._queue.pop(p.name, None)
            return True

    def _count_caller(self, seconds: float) -> None:
        self.caller_hashes += 1
        self.caller_seconds += seconds

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                _, p = self._queue.popitem(last=False)
                p._state = _RUNNING
            p._set(self._hash(p.path))
