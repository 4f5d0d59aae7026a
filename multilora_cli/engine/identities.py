"""`AdapterIdentities`: each adapter's prefix-cache identity, hashed on a background thread.

The prefix cache keys KV by what an adapter IS (adapters/identity.py: a content hash of its files, 3 MiB of reads
and hashing for a large weights file, ~3-4 ms). Hashed on the step loop's thread at each adapter's first request,
that was ~3 s of host time between steps in the 1,000-adapter bench (863 adapters first seen during the timed
run; issue 38). Here the hash starts on a worker when the adapter's first request is queued and is claimed when a
request of it is admitted (`resolve`), a whole waiting window later: the worker has long finished. hashlib and
file reads release the GIL, so the worker does not slow the step loop either.
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


class AdapterIdentities:
    """Adapter name -> "lora:<hash>" (None: unreadable). `start(name)` returns the identity if known, else a
    Future of it (hashing started); `resolve(value)` turns either into the identity."""

    def __init__(self, paths: dict[str, Path], threads: int = 1):
        self._paths = paths
        self._threads = threads
        self._known: dict[str, str | None | Future] = {}
        self._pool: ThreadPoolExecutor | None = None

    def start(self, name: str) -> str | None | Future:
        got = self._known.get(name, self)
        if isinstance(got, Future) and got.done():
            got = self._known[name] = got.result()
        if got is not self:
            return got
        if self._threads <= 0:  # no worker: hash here
            got = self._known[name] = _identity(self._paths[name])
            return got
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="lora-identity")
        got = self._known[name] = self._pool.submit(_identity, self._paths[name])
        return got

    @staticmethod
    def resolve(value: str | None | Future) -> str | None:
        """The identity `start` gave (waits for a hash still running)."""
        return value.result() if isinstance(value, Future) else value

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
