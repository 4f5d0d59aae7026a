"""`resolve_device`, `pick_device`: the one place `--device auto | cuda | cpu` becomes the device a run uses.

Slot sizing before the model loads (run/setup.py via slot_budget.spare_gpu_bytes), the data-parallel launcher
(distributed/launch.py) and the model runner (engine/runner.py) all ask here, so they agree and a missing GPU
gives one message wherever it is noticed first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from multilora_cli.errors import UsageError

if TYPE_CHECKING:
    import torch


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


def pick_device(requested: str) -> torch.device:
    """The torch device of `requested` ("auto" | "cuda" | "cpu", `resolve_device`): CUDA is the current CUDA
    device."""
    import torch

    if resolve_device(requested) == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
