"""Where the economics inputs come from: a model preset / directory / Hub id, a real adapter, a run's stats.

Every loader fails with a one-line MultiloraError: flag values the user can fix -> UsageError (exit 2),
files that are missing or unreadable -> ModelError / AdapterError / InputError (exit 1).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from multilora_cli.economics.presets import MODEL_PRESETS, model_preset
from multilora_cli.economics.shapes import AdapterShape, shape_from_modules
from multilora_cli.errors import AdapterError, InputError, ResolveError, UnsupportedAdapterError, UsageError
from multilora_cli.models.config import LINEAR_MODULES, ModelConfig

DEFAULT_MODEL = "llama-2-7b"  # the seeds' reference model
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_LORA_KEY = re.compile(
    rf"layers\.(\d+)\.(?:[\w.]+\.)?({'|'.join(LINEAR_MODULES)})\.lora_([AB])(?:\.[\w\-]+)?\.weight$")


@dataclass(slots=True)
class ModelSource:
    config: ModelConfig
    label: str  # what the report calls it
    source: str  # "preset" | "directory" | "hub"


def _hub(spec: str, kind: str) -> Path:
    """A Hub id -> local directory through the adapters resolver (downloads nothing for presets/dirs)."""
    try:
        from multilora_cli.adapters.resolve import resolve
    except ImportError:
        raise ResolveError(f"{spec}: cannot resolve Hub ids in this build",
                           hint="download it and pass the local directory") from None
    got = resolve(spec, kind=kind)
    return Path(getattr(got, "path", got))


def resolve_model(spec: str | None) -> ModelSource:
    """`spec` is a preset name, a model directory (or its config.json), or a Hub id; None = the default preset."""
    spec = spec or DEFAULT_MODEL
    preset = model_preset(spec)
    if preset is not None:
        return ModelSource(preset, spec.lower(), "preset")
    path = Path(spec).expanduser()
    if path.is_file() and path.name == "config.json":
        path = path.parent
    if path.is_dir():
        return ModelSource(ModelConfig.from_dir(path), str(spec), "directory")
    if _HUB_ID.match(spec) and not spec.startswith((".", "~")):
        return ModelSource(ModelConfig.from_dir(_hub(spec, "model")), spec, "hub")
    if "/" in spec or spec.startswith((".", "~")):
        raise ResolveError(f"--model {spec}: no such directory")
    raise UsageError(f"--model: unknown preset {spec!r}",
                     hint=f"presets: {', '.join(MODEL_PRESETS)}; or a model directory or Hub id")


def adapter_dir(spec: str) -> Path:
    """An adapter path or Hub id -> a local directory holding adapter_config.json."""
    path = Path(spec).expanduser()
    if not path.exists() and _HUB_ID.match(spec):
        path = _hub(spec, "adapter")
    if not path.is_dir():
        raise AdapterError(f"--adapter {spec}: no such directory")
    if not (path / "adapter_config.json").is_file():
        raise AdapterError(f"--adapter {spec}: no adapter_config.json", hint="point at a PEFT LoRA adapter directory")
    return path


def adapter_base_model(path: Path) -> str | None:
    """The adapter's `base_model_name_or_path` (the model it was trained on), if it names one."""
    try:
        cfg = json.loads((path / "adapter_config.json").read_text())
    except (OSError, ValueError) as e:
        raise AdapterError(f"{path}/adapter_config.json: unreadable: {e}") from None
    base = cfg.get("base_model_name_or_path") if isinstance(cfg, dict) else None
    return base or None


def load_adapter_shape(path: Path, model: ModelConfig) -> AdapterShape:
    """Per-module LoRA shapes of the adapter at `path`, validated against `model`.

    Uses the engine's adapter loader when present (same validation as `multilora run`); otherwise reads the
    config and the safetensors header (shapes only, no tensor data).
    """
    try:
        from multilora_cli.adapters.peft import load_adapter
    except ImportError:
        load_adapter = None
    if load_adapter is not None:
        adapter = load_adapter(path, path.name, model_config=model)
        entries = [(layer, mod, m.a.shape[0], m.a.shape[1], m.b.shape[0])
                   for (layer, mod), m in adapter.modules.items()]
    else:
        entries = _entries_from_files(path)
    return shape_from_modules(entries, source=str(path), model=model)


def _entries_from_files(path: Path) -> list[tuple[int, str, int, int, int]]:
    cfg = json.loads((path / "adapter_config.json").read_text())
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise UnsupportedAdapterError(f"{path}: peft_type {cfg.get('peft_type')!r} is not LoRA")
    if cfg.get("use_dora"):
        raise UnsupportedAdapterError(f"{path}: DoRA adapters (use_dora) are not servable yet")
    shapes = _tensor_shapes(path)
    a: dict[tuple[int, str], list[int]] = {}
    b: dict[tuple[int, str], list[int]] = {}
    for key, shape in shapes.items():
        m = _LORA_KEY.search(key)
        if m is None:
            raise UnsupportedAdapterError(f"{path}: tensor {key} is not a LoRA A/B of a decoder linear layer")
        (a if m.group(3) == "A" else b)[(int(m.group(1)), m.group(2))] = shape
    if a.keys() != b.keys():
        raise AdapterError(f"{path}: lora_A and lora_B tensors do not pair up")
    return [(layer, mod, a[(layer, mod)][0], a[(layer, mod)][1], b[(layer, mod)][0]) for layer, mod in a]


def _tensor_shapes(path: Path) -> dict[str, list[int]]:
    st = path / "adapter_model.safetensors"
    try:
        if st.is_file():  # safetensors: u64 header length, then a JSON header {name: {dtype, shape, ...}}
            with st.open("rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
        legacy = path / "adapter_model.bin"
        if legacy.is_file():
            import torch

            return {k: list(v.shape) for k, v in torch.load(legacy, map_location="cpu", weights_only=True).items()}
    except Exception as e:  # noqa: BLE001 - any decode failure means a broken weights file
        raise AdapterError(f"{path}: unreadable adapter weights: {e}") from None
    raise AdapterError(f"{path}: no adapter_model.safetensors or adapter_model.bin")


@dataclass(slots=True)
class MeasuredRun:
    """The figures of a `multilora run --stats` JSON that the economics use."""

    path: str
    completion_tokens_per_second: float
    tokens_per_second: float | None = None
    model: str = ""
    device: str = ""
    dtype: str = ""
    requests: int | None = None
    completion_tokens: int | None = None
    steps: int | None = None
    wall_seconds: float | None = None
    slot_loads: int | None = None
    slot_hits: int | None = None
    slot_evictions: int | None = None
    max_loras: int | None = None
    adapters: int | None = None

    @property
    def hit_rate(self) -> float | None:
        refs = (self.slot_loads or 0) + (self.slot_hits or 0)
        return None if self.slot_hits is None or self.slot_loads is None or refs == 0 else self.slot_hits / refs

    @property
    def step_seconds(self) -> float | None:
        return self.wall_seconds / self.steps if self.steps and self.wall_seconds else None

    @property
    def loads_per_step(self) -> float | None:
        return self.slot_loads / self.steps if self.steps and self.slot_loads is not None else None

    @property
    def mean_completion_tokens(self) -> float | None:
        return self.completion_tokens / self.requests if self.requests and self.completion_tokens else None


def load_stats(path: str) -> MeasuredRun:
    """Read a run's stats JSON; it must carry a positive completion_tokens_per_second."""
    try:
        data = json.loads(Path(path).expanduser().read_text())
    except OSError as e:
        raise InputError(f"--stats {path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise InputError(f"--stats {path}: not valid JSON: {e}") from None
    if not isinstance(data, dict) or "completion_tokens_per_second" not in data:
        raise InputError(f"--stats {path}: not a run stats file (no completion_tokens_per_second)",
                         hint="write one with `multilora run ... --stats run_stats.json`")

    def num(key: str, kind=float):
        v = data.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise InputError(f"--stats {path}: {key} must be a non-negative number, got {v!r}")
        return kind(v)

    tps = num("completion_tokens_per_second")
    if not tps:
        raise InputError(f"--stats {path}: completion_tokens_per_second is 0; the run generated nothing to measure")
    per_adapter = data.get("per_adapter")
    return MeasuredRun(
        path=str(path), completion_tokens_per_second=tps, tokens_per_second=num("tokens_per_second"),
        model=str(data.get("model") or ""), device=str(data.get("device") or ""), dtype=str(data.get("dtype") or ""),
        requests=num("requests", int), completion_tokens=num("completion_tokens", int), steps=num("steps", int),
        wall_seconds=num("wall_seconds"), slot_loads=num("slot_loads", int), slot_hits=num("slot_hits", int),
        slot_evictions=num("slot_evictions", int), max_loras=num("max_loras", int),
        adapters=len([k for k in per_adapter if k != "base"]) if isinstance(per_adapter, dict) else None,
    )
