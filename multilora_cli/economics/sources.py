"""Where the economics inputs come from: a model preset / directory / Hub id, a real adapter, a run's stats.

Every loader fails with a one-line MultiloraError: flag values the user can fix -> UsageError (exit 2),
files that are missing or unreadable -> ModelError / AdapterError / InputError (exit 1).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from multilora_cli.adapters.config import AdapterConfig
from multilora_cli.adapters.preflight import adapter_base
from multilora_cli.adapters.resolve import looks_like_path, resolve
from multilora_cli.economics.presets import MODEL_PRESETS, model_preset, preset_name
from multilora_cli.economics.shapes import AdapterShape, shape_from_modules
from multilora_cli.errors import InputError, UsageError
from multilora_cli.models.config import ModelConfig
from multilora_cli.paths import expand_user

DEFAULT_MODEL = "llama-2-7b"  # the seeds' reference model


@dataclass(slots=True)
class ModelSource:
    config: ModelConfig
    label: str  # what the report calls it
    source: str  # "preset" | "directory" | "hub"


def resolve_model(spec: str | None) -> ModelSource:
    """`spec` is a preset name, a model directory (or its config.json), or a Hub id; None = the default preset.

    A Hub id fetches config.json only: the arithmetic needs the shape, not the weights.
    """
    spec = spec or DEFAULT_MODEL
    name = preset_name(spec)
    if name is not None:  # also the Hub id a preset came from: no download needed
        return ModelSource(model_preset(name), name, "preset")
    if "/" not in spec and not expand_user(spec).exists():
        raise UsageError(
            f"--model: unknown preset {spec!r}",
            hint=f"presets: {', '.join(MODEL_PRESETS)}; or a model directory or Hub id org/name",
        )
    local = looks_like_path(spec) or expand_user(spec).exists()
    path = resolve(spec, kind="model", allow_patterns=["config.json"])
    config = ModelConfig.from_dir(
        path, adapter_hint=f"pass it as --adapter {spec}; its base model is then the default --model"
    )
    return ModelSource(config, spec, "directory" if local else "hub")


def adapter_dir(spec: str) -> tuple[Path, str | None]:
    """An adapter path or Hub id -> (local directory, the base model it names as a --model spec or None)."""
    path = resolve(spec, kind="adapter")
    return path, adapter_base(path, AdapterConfig.from_dir(path))


def load_adapter_shape(path: Path, model: ModelConfig) -> AdapterShape:
    """Per-module LoRA shapes of the adapter at `path`, validated against `model` by the engine's own loader
    (so an adapter `multilora run` would refuse is refused here too)."""
    from multilora_cli.adapters.peft import load_adapter  # imports torch: only when --adapter is used

    adapter = load_adapter(path, path.name, model_config=model)
    entries = [(layer, mod, m.a.shape[0], m.a.shape[1], m.b.shape[0]) for (layer, mod), m in adapter.modules.items()]
    # MoE expert LoRA (adapters/experts.py): one entry per (layer, expert), so a row's `layers` counts layer-experts
    for (layer, part), (a, b, _) in adapter.experts.items():
        entries += [(layer, f"experts.{part}", a.shape[1], a.shape[2], b.shape[1])] * a.shape[0]
    dora = sum(m.numel() for m in adapter.magnitudes.values())  # DoRA's magnitudes: stored and moved with A / B
    full, vocab = 0, adapter.vocab
    if vocab is not None:  # LoRA on embed_tokens (V -> H) / lm_head (H -> V): one "layer" each; copies [V, H]
        for module, m in (("embed_tokens", vocab.embed), ("lm_head", vocab.head)):
            if m is not None:
                entries.append((0, module, m.rank, m.a.shape[1], m.b.shape[0]))
        full = sum(t.numel() for t in (vocab.embed_full, vocab.head_full) if t is not None)
    return shape_from_modules(entries, source=str(path), dora_params=dora, full_params=full)


@dataclass(slots=True)
class MeasuredRun:
    """The figures of a `multilora run --stats` JSON that the economics use."""

    path: str
    completion_tokens_per_second: float  # one worker's (= one replica's), over the generation time
    model: str = ""
    device: str = ""
    dtype: str = ""
    requests: int | None = None  # requests that generated: error records (no tokens) left out
    completion_tokens: int | None = None
    steps: int | None = None
    generation_seconds: float | None = None
    slot_loads: int | None = None
    slot_hits: int | None = None
    workers: int = 1  # data-parallel workers (GPUs, each a full copy) whose counters the file sums

    @property
    def hit_rate(self) -> float | None:
        if self.slot_hits is None or self.slot_loads is None or self.slot_hits + self.slot_loads == 0:
            return None
        return self.slot_hits / (self.slot_hits + self.slot_loads)

    @property
    def step_seconds(self) -> float | None:
        # `steps` sums the workers' steps, each worker ran its share in the generation time
        return self.generation_seconds * self.workers / self.steps if self.steps and self.generation_seconds else None

    @property
    def loads_per_step(self) -> float | None:
        return self.slot_loads / self.steps if self.steps and self.slot_loads is not None else None

    @property
    def mean_completion_tokens(self) -> float | None:
        return self.completion_tokens / self.requests if self.requests and self.completion_tokens else None


def load_stats(path: str) -> MeasuredRun:
    """Read a run's stats JSON (or a bare EngineStats dict); it must carry a positive completion_tokens_per_second.

    Step counts live in the run file's `engine` object; its generation_seconds is the engine's time.
    """
    try:
        data = json.loads(expand_user(path).read_text())
    except OSError as e:
        raise InputError(f"--stats {path}: cannot read: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:  # RecursionError: nesting deeper than the parser's stack
        raise InputError(f"--stats {path}: not valid JSON: {e}") from None
    if not isinstance(data, dict) or "completion_tokens_per_second" not in data:
        raise InputError(
            f"--stats {path}: not a run stats file (no completion_tokens_per_second)",
            hint="write one with `multilora run ... --stats run_stats.json`",
        )
    engine = data["engine"] if isinstance(data.get("engine"), dict) else data

    def num(d: dict, key: str, kind=float):
        v = d.get(key)
        if v is None:
            return None
        # Python's json reads NaN, Infinity and 1e999 (inf): they would reach the report and its --json output
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise InputError(f"--stats {path}: {key} must be a non-negative number, got {v!r}")
        if kind is int and v != int(v):
            raise InputError(f"--stats {path}: {key} must be a whole number, got {v!r}")
        return kind(v)

    tps = num(data, "completion_tokens_per_second")
    if not tps:
        raise InputError(f"--stats {path}: completion_tokens_per_second is 0; the run generated nothing to measure")
    # `multilora run --data-parallel N`: tokens/s and steps are all N workers' (one GPU and full copy each), and a
    # replica is one of them
    dp = data.get("data_parallel") if isinstance(data.get("data_parallel"), dict) else engine.get("data_parallel")
    workers = num(dp, "world_size", int) if isinstance(dp, dict) and "world_size" in dp else 1
    if workers == 0:
        raise InputError(f"--stats {path}: data_parallel.world_size must be a positive whole number, got 0")
    workers = workers or 1  # null: a file that does not say
    return MeasuredRun(
        path=str(path),
        completion_tokens_per_second=tps / workers,
        workers=workers,
        model=str(data.get("model") or engine.get("model") or ""),
        device=str(data.get("device") or engine.get("device") or ""),
        dtype=str(data.get("dtype") or engine.get("dtype") or ""),
        requests=_generated(data, num),
        completion_tokens=num(data, "completion_tokens", int),
        steps=num(engine, "steps", int),
        generation_seconds=num(data, "generation_seconds") or num(engine, "wall_seconds"),
        slot_loads=num(data, "slot_loads", int),
        slot_hits=num(data, "slot_hits", int),
    )


def _generated(data: dict, num) -> int | None:
    """Requests that generated tokens. `requests` counts error records too (a run's and the engine's dict both):
    they add no tokens, so dividing by it understated the tokens per request. A run file says `ok`; an engine
    dict says `errors`."""
    if "ok" in data:
        return num(data, "ok", int)
    requests, errors = num(data, "requests", int), num(data, "errors", int)
    return requests if requests is None or errors is None else max(requests - errors, 0)
