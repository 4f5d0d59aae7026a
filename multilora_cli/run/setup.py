"""Setting up a `multilora run` before any line is read: pre-flight of the adapters (+ base model), and the
engine config it implies (the GPU slot count when --max-loras is not given: engine/slot_budget.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from multilora_cli.config import EngineConfig
from multilora_cli.run.config import RunConfig


def note(msg: str, quiet: bool = False) -> None:
    """One `multilora: ...` line on stderr."""
    if not quiet and sys.stderr is not None:  # None (stderr closed): print() would write to stdout instead
        print(f"multilora: {msg}", file=sys.stderr, flush=True)


def preflight_run(cfg: RunConfig):
    """adapters.preflight.Preflight of the run; each adapter that failed gets a one-line warning."""
    from multilora_cli.adapters.preflight import parse_adapter_specs, preflight

    specs = parse_adapter_specs(cfg.adapters, cfg.adapter_dir)
    pf = preflight(specs, cfg.model, max_loras=cfg.max_loras, max_lora_rank=cfg.max_lora_rank)
    for name, err in pf.errors.items():
        note(f"warning: adapter {name!r} failed pre-flight; lines naming it get error records: {why(name, err)}")
    for w in pf.warnings:
        note(f"warning: {w}")
    return pf


def max_loras(cfg: RunConfig, pf, n_adapters: int) -> int:
    """--max-loras, else on a GPU one slot per adapter within a share of the memory beside the weights;
    pre-flight's default is the CPU one."""
    from multilora_cli.engine.slot_budget import auto_max_loras, slot_bytes, spare_gpu_bytes

    if cfg.max_loras is not None:
        return pf.max_loras
    eng = cfg.engine
    spare = spare_gpu_bytes(eng.device, pf.model_config, eng.itemsize, eng.gpu_memory_utilization)
    if spare is None:
        return pf.max_loras
    one = slot_bytes(pf.model_config, pf.max_lora_rank, eng.itemsize)
    if any(s.config.use_dora for s in pf.scans.values()):  # DoRA's float32 scale rows in every slot
        from multilora_cli.adapters.costs import dora_slot_bytes

        one += dora_slot_bytes(pf.model_config)
    return auto_max_loras(n_adapters, one, spare)


def engine_config(cfg: RunConfig, pf, good: dict[str, Path]) -> EngineConfig:
    """The EngineConfig of a run whose adapters `good` passed pre-flight `pf`."""
    return cfg.engine.engine_config(
        str(pf.model_path), max_loras=max_loras(cfg, pf, len(good)), max_lora_rank=pf.max_lora_rank, seed=cfg.seed
    )


def why(name: str, err) -> str:
    """The pre-flight error without its leading "adapter 'x'" (the message around it names the adapter)."""
    text = err.one_line()
    for prefix in (f"adapter {name!r}: ", f"adapter {name!r} "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
            if text.startswith("("):  # "(./path/adapter_config.json) uses DoRA" -> "./path/...: uses DoRA"
                inside, _, after = text[1:].partition(")")
                text = f"{inside}: {after.lstrip(': ')}"
            break
    return text
