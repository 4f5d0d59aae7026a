"""`AdapterIdentities`: each adapter's prefix-cache identity, hashed on a background thread.

The prefix cache keys KV by what an adapter IS (adapters/identity.py: a content hash of its files, 3 MiB of reads
and hashing for a large weights file, ~3-4 ms). Hashed on the step loop's thread at each adapter's first request,
that was ~3 s of host time between steps in the 1,000-adapter bench (863 adapters first seen during the timed
run; issue 38). Here the hash starts on a worker when the adapter's first request is queued and is claimed when a
request of it is admitted (`PendingIdentity.get`), mostly a waiting window later, when the workers are done with
it. hashlib and file reads release the GIL, so the workers do not slow the step loop either.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from multilora_cli.adapters.identity import adapter_identity


def _identity(path: Path) -> str | None:
    try:
        return f"lora:{adapter_identity(path)}"
    except OSError:
        return None  # unreadable: the adapter takes no part in the cache (its load fails the request anyway)


class PendingIdentity:
    """An identity whose hash was handed to a worker. `get()` (the step loop, at admission): its value; one still
    queued behind other adapters' hashes is taken back and hashed on the spot, so an admission waits for its own
    adapter's hash at most, never for the queue before it (the feed queues them in request order, the admission
    takes adapters in its own order)."""

    __slots__ = ("_fut", "_path", "_value", "_known")

    def __init__(self, fut: Future, path: Path):
        self._fut, self._path = fut, path
        self._value: str | None = None
        self._known = False

    def done(self) -> bool:
        return self._known or self._fut.done()

    def get(self) -> str | None:
        if not self._known:
            self._value = _identity(self._path) if self._fut.cancel() else self._fut.result()
            self._known = True
        return self._value


class AdapterIdentities:
    """Adapter name -> "lora:<hash>" (None: unreadable). `start(name)` returns the identity if known, else a
    `PendingIdentity` (its hash queued on the workers)."""

    def __init__(self, paths: dict[str, Path], threads: int = 2):
        self._paths = paths
        self._threads = threads
        self._known: dict[str, str | None | PendingIdentity] = {}
        self._pool: ThreadPoolExecutor | None = None

    def start(self, name: str) -> str | None | PendingIdentity:
        got = self._known.get(name, self)
        if isinstance(got, PendingIdentity) and got.done():
            got = self._known[name] = got.get()
        if got is not self:
            return got
        if self._threads <= 0:  # no workers: hash here
            got = self._known[name] = _identity(self._paths[name])
            return got
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="lora-identity")
        path = self._paths[name]
        got = self._known[name] = PendingIdentity(self._pool.submit(_identity, path), path)
        return got

    @staticmethod
    def resolve(value: str | None | PendingIdentity) -> str | None:
        """The identity `start` gave (hashing it now if no worker has started on it)."""
        return value.get() if isinstance(value, PendingIdentity) else value

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
