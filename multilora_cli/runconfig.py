"""`RunConfig`: everything `multilora run` was asked to do, validated on construction (flag problems: exit 2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from multilora_cli.errors import UsageError
from multilora_cli.io.sampling import SamplingResolver
from multilora_cli.io.sink import names_a_descriptor
from multilora_cli.paths import expand_user

BASE = "base"


@dataclass(slots=True)
class RunConfig:
    """Everything `multilora run` was asked to do. Flag-level problems raise UsageError (exit 2)."""

    input: str
    model: str | None = None
    adapters: list[str] = field(default_factory=list)  # items of --adapters (comma lists already split)
    adapter_dir: str | None = None
    output: str | None = None  # None / "-" = stdout
    errors: str | None = None
    stats: str | None = None
    resume: bool = False
    sampling: dict = field(default_factory=dict)  # CLI sampling flags given: max_tokens, temperature, top_p, top_k
    seed: int | None = None  # the run's seed: EngineConfig.seed (the engine derives per-line seeds from it)
    max_loras: int | None = None
    max_lora_rank: int | None = None
    gpu_hour_usd: float | None = None
    quiet: bool = False
    engine: dict = field(default_factory=dict)  # further EngineConfig fields (dtype, device, max_num_seqs, ...)
    data_parallel: int = 1  # workers (processes) on this machine; >1 runs through multilora_cli.distributed
    dp_sharding: str = "affinity"  # how a data-parallel run splits requests: "affinity" | "round-robin"

    def __post_init__(self) -> None:
        if isinstance(self.data_parallel, bool) or not isinstance(self.data_parallel, int) or self.data_parallel < 1:
            raise UsageError(f"--data-parallel must be an integer >= 1, got {self.data_parallel!r}")
        if self.resume and self.output in (None, "-"):
            raise UsageError("--resume needs -o/--output: a run written to stdout cannot be resumed")
        if self.resume and names_a_descriptor(self.output):
            raise UsageError(
                f"--resume needs -o FILE: {self.output} is an open descriptor, not a file a run can "
                "keep its --resume ledger beside",
                hint="give -o the output file's own path",
            )
        if self.gpu_hour_usd is not None and self.gpu_hour_usd < 0:
            raise UsageError(f"--gpu-hour-usd must be >= 0, got {self.gpu_hour_usd}")
        for flag, path in (("--errors", self.errors), ("--stats", self.stats)):
            if path == "-":  # stdout carries the result records, one per input line, and nothing else
                raise UsageError(f"{flag} - would mix into the results on stdout; give {flag} a file path")
        if not self.model and not self.adapters and not self.adapter_dir:
            raise UsageError("give a base model (--model) or adapters (--adapters / --adapter-dir) to run")
        files = {"INPUT": self.input, "--output": self.output, "--errors": self.errors, "--stats": self.stats}
        seen: dict[Path, str] = {}
        for flag, path in files.items():
            if path in (None, "-"):
                continue
            p = expand_user(path).resolve()
            if p in seen:
                raise UsageError(f"{seen[p]} and {flag} are the same file ({path}); give different paths")
            seen[p] = flag
        SamplingResolver({}, self.sampling)  # bad sampling flags: exit 2 now, not per line
        self.engine = {k: v for k, v in self.engine.items() if v is not None}


def base_aliases(model_names: list[str | None], model_path: Path, adapters=()) -> set[str]:
    """Names that mean "the base model" in a line: 'base', the model as named, its path, folder name, Hub id;
    not the names of `adapters`: a base in ./models/legal must not answer the lines of adapter 'legal'."""
    names = {BASE, str(model_path), model_path.name}
    names.update(n for n in model_names if n)
    if model_path.parent.name == "snapshots" and model_path.parent.parent.name.startswith("models--"):
        names.add(model_path.parent.parent.name[len("models--") :].replace("--", "/"))
    return names - (set(adapters) - {BASE})
