"""`JobEngine`: what RunJob asks of an engine, and `EngineFactory`, how it gets one from an EnginePlan.

engine/engine.py `Engine` (one process) and distributed/coordinator.py `DistributedEngine` (rank 0 of several)
both have this surface, structurally: neither imports this module, and the job reads nothing else of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from multilora_cli.engine.request import Request, Result
from multilora_cli.run.plan import EnginePlan


class StatsSource(Protocol):
    def to_dict(self) -> dict:
        """The engine's stats section of the run's stats JSON."""
        ...


class JobEngine(Protocol):
    @property
    def default_sampling(self) -> dict:
        """The model's sampling defaults (generation_config.json), under the run's flags and each line's own."""
        ...

    @property
    def stats(self) -> StatsSource:
        """Read once generation has ended."""
        ...

    @property
    def slot_loads(self) -> int:
        """Adapter loads into GPU slots so far, live while generating (the progress line)."""
        ...

    def generate(self, requests: Iterable[Request]) -> Iterator[Result]:
        """One Result per request, in any order; requests are pulled lazily (possibly from another thread)."""
        ...

    def annotate_stats(self, stats: dict) -> None:
        """Add the engine's own sections to the run's finished stats dict (before it is written)."""
        ...

    def print_summary(self, stats: dict) -> None:
        """Print the engine's own lines after the run's summary on stderr (not with --quiet)."""
        ...

    def close(self) -> None:
        """Stop background work after a failure."""
        ...


EngineFactory = Callable[[EnginePlan], JobEngine]
