"""`resolve_device`: the one place `--device auto | cuda | cpu` becomes the device a run uses.

Slot sizing before the model loads (run/setup.py via slot_budget.spare_gpu_bytes), the data-parallel launcher
(distributed/launch.py) and the model runner (engine/runner.py) all ask here, so they agree and a missing GPU
gives one message wherever it is noticed first.
"""

from __future__ import annotations

from multilora_cli.errors import UsageError


def resolve_device(requested: str) -> str:
    """ "cuda" or "cpu" for `requested`: "auto" is CUDA when a CUDA device is visible, else CPU. "cuda" without
    one is a UsageError (exit 2)."""
    if requested == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if requested == "cuda":
        raise UsageError("--device cuda was asked for but no CUDA device is visible", hint="use --device cpu")
    return "cpu"
