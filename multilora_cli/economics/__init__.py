"""`multilora economics`: the multi-tenant LoRA arithmetic, from real model configs, adapters and measured runs.

report = compute(Scenario(tenants=100, model="llama-2-7b", rank=16))
report.section("adapter")["bytes"]   # 33554432 (32 MiB)
report.to_dict()                     # every assumption and figure, JSON-ready
"""

from multilora_cli.economics.analysis import analyze, compute
from multilora_cli.economics.presets import GPU_PRESETS, MODEL_PRESETS, GpuSpec, model_preset
from multilora_cli.economics.render import render
from multilora_cli.economics.report import Figure, Report, Section
from multilora_cli.economics.scenario import Assumption, Scenario, resolve
from multilora_cli.economics.shapes import AdapterShape, ModuleShape, parse_targets, shape_from_flags
from multilora_cli.economics.slots import expected_distinct, lru_hit_rate, popularity
from multilora_cli.economics.sources import MeasuredRun, load_stats, resolve_model

__all__ = [
    "AdapterShape",
    "Assumption",
    "Figure",
    "GPU_PRESETS",
    "GpuSpec",
    "MODEL_PRESETS",
    "MeasuredRun",
    "ModuleShape",
    "Report",
    "Scenario",
    "Section",
    "analyze",
    "compute",
    "expected_distinct",
    "load_stats",
    "lru_hit_rate",
    "model_preset",
    "parse_targets",
    "popularity",
    "render",
    "resolve",
    "resolve_model",
    "shape_from_flags",
]
