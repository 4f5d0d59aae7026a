"""Whether a measured run (`--stats`) may stand in for the roofline when sizing the shared fleet.

Decode throughput and step time depend on the model's shape, the bytes per parameter and the device, so a run's
tokens/s sizes the fleet only when all three match what is being sized:
  model   the same shape: the run's model resolves (preset name, Hub id of a preset, or a model directory that
          is still there) to the same layers / hidden / intermediate / heads / kv heads / head_dim / vocab;
          when its shape cannot be read, its folder or Hub name must be the sized model's.
  dtype   the same bytes per parameter (bfloat16 and float16 are alike, float32 is not).
  device  a CUDA GPU of the sized --gpu family (a100 40 vs 80 GB told apart when the name says). A run's device
          that does not name its GPU ("cuda:0") is taken as the sized GPU, with a caveat.
Otherwise the roofline sizes the fleet and the measured figures are only shown. Figures that do not depend on
the hardware (generated tokens per request, slot hit rate, loads per step) are used either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from multilora_cli.economics.presets import DTYPE_BYTES, GPU_PRESETS, GpuSpec, model_preset
from multilora_cli.economics.sources import MeasuredRun, ModelSource
from multilora_cli.errors import MultiloraError
from multilora_cli.models.config import ModelConfig
from multilora_cli.paths import expand_user

# the fields that set bytes read per decode step, with the words the report uses for them
_SHAPE = (
    ("num_hidden_layers", "layers"),
    ("hidden_size", "hidden"),
    ("intermediate_size", "intermediate"),
    ("num_attention_heads", "heads"),
    ("num_key_value_heads", "kv heads"),
    ("head_dim", "head_dim"),
    ("vocab_size", "vocab"),
    ("tie_word_embeddings", "tied embeddings"),
)


@dataclass(slots=True, frozen=True)
class Comparability:
    """`ok`: the measured throughput and step time may size the fleet. `reasons`: why not (ok False) or the
    caveat it is used under (ok True), each a short clause."""

    ok: bool
    reasons: tuple[str, ...] = ()


def _basename(spec: str) -> str:
    return spec.strip().rstrip("/\\").replace("\\", "/").split("/")[-1].lower()


def _measured_shape(spec: str, stats_path: str) -> ModelConfig | None:
    """The run's model shape: a preset (by name, Hub id or folder name) or a model directory still on disk."""
    for key in (spec, _basename(spec)):
        cfg = model_preset(key) if key else None
        if cfg is not None:
            return cfg
    here = expand_user(spec)
    for d in (here, expand_user(stats_path).parent / here):  # a relative path: from the cwd or beside the file
        d = d.parent if d.name == "config.json" else d
        if (d / "config.json").is_file():
            try:
                return ModelConfig.from_dir(d)
            except MultiloraError:  # unreadable or unsupported: fall back on the name
                return None
    return None


def _model_reason(stats: MeasuredRun, model: ModelSource) -> str | None:
    m = stats.model.strip()
    if not m:
        return "the stats name no model"
    shape = _measured_shape(m, stats.path)
    cfg = model.config
    if shape is None:  # e.g. a Hub id not cached here: compare names
        names = {_basename(model.label), _basename(cfg.name_or_path)} - {""}
        return None if _basename(m) in names else f"model shape unknown here, and {_basename(m)!r} is another name"
    diff = [
        f"{word} {getattr(shape, f)} vs {getattr(cfg, f)}" for f, word in _SHAPE if getattr(shape, f) != getattr(cfg, f)
    ]
    return f"another model shape ({', '.join(diff[:3])}{', ...' if len(diff) > 3 else ''})" if diff else None


def _gpu_tokens(device: str) -> list[str]:
    return re.split(r"[\s\-_:/,()]+", device.lower())


def _device_reason(stats: MeasuredRun, gpu: GpuSpec) -> tuple[str | None, str | None]:
    """(why the device is not comparable, or None; a caveat when it is taken as the sized GPU unverified)."""
    device = stats.device.strip()
    tokens = [t for t in _gpu_tokens(device) if t]
    families = {g.split("-")[0] for g in GPU_PRESETS}
    if not tokens or not (
        tokens[0] == "cuda" or "nvidia" in tokens or any(t.startswith(f) for t in tokens for f in families)
    ):
        return (f"{device} is not a CUDA GPU" if device else "the stats name no device"), None  # cpu, mps, ...
    named = [t for t in tokens if not t.isdigit() and t not in ("nvidia", "cuda")]
    if not named:  # the engine records str(torch.device): "cuda:0" says nothing about which GPU
        return None, f"device {device!r} does not name its GPU; taken as a {gpu.name}"
    family, *variant = gpu.name.split("-")  # "a100", ["80gb"]; "h100", ["sxm"]
    if not any(t.startswith(family) for t in named):
        return f"{device!r} is not a {gpu.name}", None
    sizes = [t for t in named if re.fullmatch(r"\d+gb", t)]
    if variant and re.fullmatch(r"\d+gb", variant[0]) and sizes and variant[0] not in sizes:
        return f"{device!r} is a {family} {sizes[0]}, not a {gpu.name}", None
    if variant == ["sxm"] and "pcie" in named:  # H100 PCIe: 2.0 TB/s against the SXM's 3.35
        return f"{device!r} is a {family} PCIe, not a {gpu.name}", None
    return None, None


def compare(stats: MeasuredRun, model: ModelSource, gpu: GpuSpec, dtype: str) -> Comparability:
    """Whether `stats` measured the model, dtype and GPU being sized (see the module docstring for the rule)."""
    reasons = []
    device_reason, caveat = _device_reason(stats, gpu)
    if device_reason:
        reasons.append(device_reason)
    model_reason = _model_reason(stats, model)
    if model_reason:
        reasons.append(model_reason)
    measured_dtype = stats.dtype.strip().lower()
    if measured_dtype and DTYPE_BYTES.get(measured_dtype) != DTYPE_BYTES[dtype]:
        reasons.append(f"{measured_dtype} weights, not {dtype}")
    if reasons:
        return Comparability(False, tuple(reasons))
    return Comparability(True, (caveat,) if caveat else ())


def not_comparable_message(stats: MeasuredRun, model: ModelSource, gpu: GpuSpec, dtype: str, c: Comparability) -> str:
    """One line: what the run measured, what is being sized, why they differ, and what the report does instead."""
    return (
        f"--stats: measured on {stats.device or '?'} with {stats.model or '?'} ({stats.dtype or '?'}), not "
        f"comparable to {model.label} ({dtype}) on {gpu.name}: {'; '.join(c.reasons)}; sizing from the roofline "
        f"(measured throughput shown for reference only)"
    )
