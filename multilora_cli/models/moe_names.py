"""Checkpoint names of MoE experts -> our 3D expert parameters (models/moe.py), both layouts:

- per expert (Hub checkpoints; what transformers 5 `save_pretrained` writes back):
    Mixtral  model.layers.{i}.block_sparse_moe.experts.{e}.w1|w3|w2.weight   (gate | up | down), router
             model.layers.{i}.block_sparse_moe.gate.weight
    Qwen MoE model.layers.{i}.mlp.experts.{e}.gate_proj|up_proj|down_proj.weight
  -> model.layers.{i}.mlp.experts.gate_up_proj[e, :I] (gate), [e, I:] (up), down_proj[e] (down)
- fused (transformers 5 in memory): model.layers.{i}.mlp.experts.gate_up_proj [E, 2I, H] / down_proj [E, H, I],
  which are our names already and load whole.
"""

from __future__ import annotations

import re

import torch

_PER_EXPERT = re.compile(
    r"^(?P<pre>.*\.layers\.\d+\.)(?:block_sparse_moe|mlp)\.experts\.(?P<e>\d+)\."
    r"(?P<name>w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$"
)
PART = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}


def rename(name: str) -> str:
    """Mixtral's block_sparse_moe.* -> mlp.* (transformers 5's module name; its router is mlp.gate)."""
    return name.replace(".block_sparse_moe.", ".mlp.")


def expert_target(name: str) -> tuple[str, int, str] | None:
    """A per-expert checkpoint tensor -> (our 3D parameter name, expert, "gate" | "up" | "down"); None otherwise."""
    m = _PER_EXPERT.match(name)
    if m is None:
        return None
    part = PART[m.group("name")]
    param = "gate_up_proj" if part != "down" else "down_proj"
    return f"{m.group('pre')}mlp.experts.{param}", int(m.group("e")), part


def expert_view(param: torch.Tensor, expert: int, part: str) -> torch.Tensor:
    """The rows of `param` ([E, 2I, H] gate_up or [E, H, I] down) that checkpoint tensor (expert, part) fills."""
    if part == "down":
        return param.data[expert]
    inter = param.shape[1] // 2
    return param.data[expert, :inter] if part == "gate" else param.data[expert, inter:]


def parts_per_param(pname: str) -> int:
    """Per-expert tensors that make up one expert's slice of a 3D parameter: gate + up, or down."""
    return 2 if pname.endswith("gate_up_proj") else 1
