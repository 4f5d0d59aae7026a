"""The precompile's dry-run step sizes give every Triton variant a MoE step of any size launches (kernels/fused_moe.py).

A variant the dry run misses compiles inside a step: on an H200 one 1,083-token prefill step of the Qwen3-30B-A3B
bench took 1.7 s instead of ~0.2, once the row path ran at prefill sizes (its alignment scan specialised on its
block count's % 16, which the dry run's power-of-two prefill sizes never gave at 64-row blocks). Here `fused_moe`
runs under `launch.collect` (launches recorded, not run: no GPU needed) at the sizes the runner dry-runs (every
decode graph bucket, `precompile.prefill_sizes`) and at step sizes a run meets (every size up to 300, a stride
through the rest, mixed steps' odd sizes); the variant keys of each step (`launch._variant`, what `compile_all`
compiles by) must be among the dry run's.
"""

from __future__ import annotations

import pytest
import torch

from multilora_cli.engine.cuda_graphs import graph_batch_sizes
from multilora_cli.engine.precompile import prefill_sizes
from multilora_cli.kernels.expert_weights import ExpertLoraWeights
from multilora_cli.kernels.fused_moe import fused_moe
from multilora_cli.kernels.launch import _variant, collect

# Qwen3-30B-A3B's routing (128 experts, top-8) and the bench's 35 slots; hidden / intermediate small (the strides
# and tile counts they give are the same at every step size)
E, K, L, R, H, INTER = 128, 8, 35, 16, 64, 48
MAX_TOKENS, MAX_SEQS = 8192, 256


def _keys(T: int, lora: ExpertLoraWeights | None) -> dict:
    """{variant key: kernel name} of one step of T tokens (every token adapted, or the base alone)."""
    x = torch.zeros(T, H, dtype=torch.bfloat16)
    weights = torch.full((T, K), 1.0 / K)
    experts = (torch.arange(T * K) % E).view(T, K)
    gate_up = torch.zeros(E, 2 * INTER, H, dtype=torch.bfloat16)
    down = torch.zeros(E, H, INTER, dtype=torch.bfloat16)
    slot = torch.arange(T) % L if lora is not None else None
    with collect() as calls:
        fused_moe(x, weights, experts, gate_up, down, slot, lora)
    return {_variant(c): getattr(c[0], "__name__", "?") for c in calls}


@pytest.mark.parametrize("adapted", [True, False])
def test_every_step_size_finds_its_moe_variants_precompiled(adapted):
    lora = ExpertLoraWeights.empty(L, R, E, H, INTER, torch.bfloat16, "cpu") if adapted else None
    graphs = graph_batch_sizes(MAX_SEQS)
    dry = {}
    for t in (*graphs, *prefill_sizes(MAX_TOKENS, tuple(graphs))):
        dry.update(_keys(t, lora))
    steps = sorted({*range(1, 301), *range(257, MAX_TOKENS + 1, 37), 634, 1014, 1083, 1209, 4097, 8130, MAX_TOKENS})
    missed = {}
    for t in steps:
        for key, name in _keys(t, lora).items():
            if key not in dry:
                missed.setdefault(name, []).append(t)
    assert not missed, {name: ts[:5] for name, ts in missed.items()}
