"""`EnginePlan`: what a run hands the engine factory, once pre-flight has run and --resume has kept its prefix.

It is everything an engine needs from the job, read-only: the single-process engine takes the config, adapters
and scans; the data-parallel one (distributed/coordinator.py) also re-reads the input to shard the lines left to
run, so it needs where the input is, how many records --resume kept, which names mean the base model, and the
sampling flags (a line's max_tokens decides its cost).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from multilora_cli.config import EngineConfig
from multilora_cli.io.sampling import SamplingFlags


@dataclass(frozen=True, slots=True)
class EnginePlan:
    """config: the run's EngineConfig. adapters: name -> local folder of the adapters that passed pre-flight.
    base_names: names a line may give for the base model (run/config.base_aliases). scans: name ->
    adapters.scan.AdapterScan from pre-flight (engines plan their reads from them). input: the input's path
    ("-" = stdin; a data-parallel launcher has spooled stdin to a file first). resumed: records --resume kept,
    so the first line left to run is the input's record `resumed` (counted from 0). sampling: the CLI flags.
    tokenizer: the base's engine.tokenizer.Tokenizer if the job loaded it (run/line_kinds.py), else None."""

    config: EngineConfig
    adapters: dict[str, Path]
    base_names: frozenset[str]
    scans: dict
    input: str
    resumed: int
    sampling: SamplingFlags
    tokenizer: object | None = None

    def engine_adapter(self, name: str | None) -> str | None:
        """The adapter a line naming `name` runs on in an engine: None for no name, a name of the base, or one
        that did not pass pre-flight (the job turns those lines into error records before any engine sees them)."""
        return None if name is None or name in self.base_names or name not in self.adapters else name
