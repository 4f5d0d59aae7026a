"""`RunConfig`: everything `multilora run` was asked to do, validated on construction (flag problems: exit 2).

Where each flag is checked, once: ranges and choices Typer can state are declared on the flags themselves
(commands/run.py: `min=` / `max=` / enums; Typer's usage error, exit 2); what it cannot (finite floats, flags
that only make sense together) is checked here, in `EngineFlags`, or in io/sampling.SamplingFlags. EngineConfig
and SamplingParams keep their own checks for library callers that never pass through the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from multilora_cli.config import GPU_MEMORY_UTILIZATION, UTILIZATION_RANGE, EngineConfig
from multilora_cli.errors import UsageError
from multilora_cli.io.sampling import SamplingFlags
from multilora_cli.io.sink import names_a_descriptor
from multilora_cli.paths import expand_user

BASE = "base"


@dataclass(frozen=True, slots=True)
class EngineFlags:
    """The EngineConfig fields a run's flags set. None = the engine's own default (EngineConfig's)."""

    dtype: str = "auto"  # one of config.DTYPES
    device: str = "auto"  # one of config.DEVICES; engine/device.resolve_device decides "auto"
    max_cpu_loras: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None  # None: the model's max_position_embeddings (capped by the KV cache)
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    pinned_arena: bool = True
    prefix_cache: bool = True  # --no-prefix-cache: compute every prompt in full (EngineConfig.prefix_cache)
    load_format: str = "auto"  # no flag: benchmarks run the real `run` path on "dummy" weights
    quantization: str = "none"  # one of config.QUANTIZATIONS

    def __post_init__(self) -> None:
        lo, hi = UTILIZATION_RANGE  # also refuses nan, which a Typer float range lets through
        if not lo <= self.gpu_memory_utilization <= hi:
            raise UsageError(f"--gpu-memory-utilization must be in [{lo}, {hi}], got {self.gpu_memory_utilization}")

    @property
    def itemsize(self) -> int:
        """Bytes per weight element the run will use, for sizing before the model loads ("auto" loads bf16)."""
        return 4 if self.dtype == "float32" else 2

    def engine_config(
        self,
        model: str,
        *,
        max_loras: int,
        max_lora_rank: int,
        seed: int | None,
        max_decode_batch: int | None = None,
        prompt_tokens_hint: int | None = None,
    ) -> EngineConfig:
        """The EngineConfig of these flags for base `model` (a local directory), pre-flight's slot sizes, the
        input's bound on sequences decoding at once and its estimated prompt tokens (None: unknown, e.g. stdin)."""
        defaulted = {"max_cpu_loras": self.max_cpu_loras, "max_num_seqs": self.max_num_seqs, "seed": seed}
        return EngineConfig(
            model=model,
            dtype=self.dtype,
            device=self.device,
            max_loras=max_loras,
            max_lora_rank=max_lora_rank,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization,
            pinned_arena=self.pinned_arena,
            prefix_cache=self.prefix_cache,
            load_format=self.load_format,
            max_decode_batch=max_decode_batch,
            prompt_tokens_hint=prompt_tokens_hint,
            quantization=self.quantization,
            **{k: v for k, v in defaulted.items() if v is not None},  # not given: EngineConfig's default
        )


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
    sampling: SamplingFlags = field(default_factory=SamplingFlags)  # --max-tokens, --temperature, ... --min-tokens
    seed: int | None = None  # the run's seed: EngineConfig.seed (the engine derives per-line seeds from it)
    max_loras: int | None = None
    max_lora_rank: int | None = None
    gpu_hour_usd: float | None = None
    quiet: bool = False
    engine: EngineFlags = field(default_factory=EngineFlags)
    data_parallel: int = 1  # workers (processes) on this machine; >1 runs through multilora_cli.distributed
    dp_sharding: str = "affinity"  # how a data-parallel run splits requests: "affinity" | "round-robin"

    def __post_init__(self) -> None:
        if self.resume and self.output in (None, "-"):
            raise UsageError("--resume needs -o/--output: a run written to stdout cannot be resumed")
        if self.resume and names_a_descriptor(self.output):
            raise UsageError(
                f"--resume needs -o FILE: {self.output} is an open descriptor, not a file a run can "
                "keep its --resume ledger beside",
                hint="give -o the output file's own path",
            )
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


def base_aliases(model_names: list[str | None], model_path: Path, adapters=()) -> set[str]:
    """Names that mean "the base model" in a line: 'base', the model as named, its path, folder name, Hub id;
    not the names of `adapters`: a base in ./models/legal must not answer the lines of adapter 'legal'."""
    names = {BASE, str(model_path), model_path.name}
    names.update(n for n in model_names if n)
    if model_path.parent.name == "snapshots" and model_path.parent.parent.name.startswith("models--"):
        names.add(model_path.parent.parent.name[len("models--") :].replace("--", "/"))
    return names - (set(adapters) - {BASE})
