"""What Triton compiled and what it loaded from its cache in this process (a run's stats, profile_cold_start).

Why: a cold process (empty TRITON_CACHE_DIR) pays seconds of compiles before and inside its first steps; a warm
one should only load. Whether a kernel missed a warm cache (its source or a constexpr differing per run, a step
size no dry run met) shows here as a compile where a load was expected.

    log = compile_log()          # installs the listener once per process; later calls return the same log
    before = log.snapshot()
    ...                          # launches, precompile
    log.since(before)            # {"compiled": n, "compile_s": s, "loaded": n, "load_s": s, "kernels": [names]}

Triton (>= 3.4) calls `knobs.compilation.listener` once per `triton.compile`, with cache_hit and the time spent
in it (µs: making the IR + lowering + storing for a compile; finding the cached binary for a hit). A listener
someone installed before keeps being called. Loading a binary onto the GPU (at its first launch) and building
a launcher module are not timed here. Older Triton has no listener: the log stays empty (`supported` False).
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field

_log: CompileLog | None = None
_install_lock = threading.Lock()


@dataclass(slots=True)
class CompileCounts:
    """Totals at one moment: compiles and cache loads, with their seconds, and the names of compiled kernels."""

    compiled: int = 0
    compile_s: float = 0.0
    loaded: int = 0
    load_s: float = 0.0
    kernels: list[str] = field(default_factory=list)  # in compile order (a name per compiled variant)


class CompileLog:
    """Counts Triton compiles and cache loads of this process. Thread-safe (compile_all compiles from a pool)."""

    def __init__(self, supported: bool):
        self.supported = supported
        self._lock = threading.Lock()
        self._counts = CompileCounts()
        self.verbose = False  # print each compile on stderr (MULTILORA_DEBUG)

    def record(self, name: str, seconds: float, cache_hit: bool) -> None:
        with self._lock:
            c = self._counts
            if cache_hit:
                c.loaded += 1
                c.load_s += seconds
            else:
                c.compiled += 1
                c.compile_s += seconds
                c.kernels.append(name)
        if not cache_hit and self.verbose:
            print(f"multilora: triton compiled {name} in {seconds:.2f} s", file=sys.stderr, flush=True)

    def snapshot(self) -> CompileCounts:
        with self._lock:
            c = self._counts
            return CompileCounts(c.compiled, c.compile_s, c.loaded, c.load_s, list(c.kernels))

    def since(self, before: CompileCounts | None = None, until: CompileCounts | None = None) -> dict:
        """The compiles and loads after `before` (None: since the log was installed) up to `until` (None: now),
        JSON-ready."""
        now, b = until or self.snapshot(), before or CompileCounts()
        return {
            "compiled": now.compiled - b.compiled,
            "compile_s": round(now.compile_s - b.compile_s, 3),
            "loaded": now.loaded - b.loaded,
            "load_s": round(now.load_s - b.load_s, 3),
            "kernels": sorted(set(now.kernels[len(b.kernels) :])),
        }


def _debug() -> bool:
    return os.environ.get("MULTILORA_DEBUG", "") not in ("", "0", "false", "no")


def compile_log() -> CompileLog:
    """This process's CompileLog, its listener installed in Triton at the first call."""
    global _log
    with _install_lock:
        if _log is not None:
            return _log
        try:
            from triton import knobs
        except ImportError:  # Triton < 3.4: no knobs module
            knobs = None
        comp = getattr(knobs, "compilation", None)
        if comp is None or not hasattr(comp, "listener"):
            _log = CompileLog(supported=False)
            return _log
        log = CompileLog(supported=True)
        log.verbose = _debug()
        previous = comp.listener

        def listener(*, src, metadata, metadata_group, times, cache_hit):
            name = getattr(src, "name", None) or str(metadata.get("name", "?"))
            log.record(name, times.total / 1e6, bool(cache_hit))
            if previous is not None:
                previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

        comp.listener = listener
        _log = log
        return _log
