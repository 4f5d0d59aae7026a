"""The precompile's dry-run step sizes give every Triton variant a step of any size launches: the MoE experts
(kernels/fused_moe.py) and the LoRA layers' SGMV kernels (kernels/sgmv.py).

A variant the dry run misses compiles inside a step: on an H200 one 1,083-token prefill step of the Qwen3-30B-A3B
bench took 1.7 s instead of ~0.2, once the row path ran at prefill sizes (its alignment scan specialised on its
block count's % 16, which the dry run's power-of-two prefill sizes never gave at 64-row blocks). Here `fused_moe`
runs under `launch.collect` (launches recorded, not run: no GPU needed) at the sizes the runner dry-runs (every
decode graph bucket, `precompile.prefill_sizes`) and at step sizes a run meets (every size up to 300, a stride
through the rest, mixed steps' odd sizes); the variant keys of each step (`launch._variant`, what `compile_all`
compiles by) must be among the dry run's. The SGMV launches likewise, the dry run's slots all 0 (as the runner's)
against steps of several adapter popularity patterns.
"""

from __future__ import annotations

import pytest
import torch

from multilora_cli.engine.cuda_graphs import graph_batch_sizes
from multilora_cli.engine.precompile import prefill_sizes
from multilora_cli.kernels import LoraMetaBuffers
from multilora_cli.kernels.expert_weights import ExpertLoraWeights
from multilora_cli.kernels.fused_moe import fused_moe
from multilora_cli.kernels.launch import _variant, collect
from multilora_cli.kernels.sgmv import add_lora_silu_mul_triton, add_lora_triton
from tests.kernels.lora_cases import make_pool, token_slots

# Qwen3-30B-A3B's routing (128 experts, top-8) and the bench's 35 slots; hidden / intermediate small (the strides
# and tile counts they give are the same at every step size)
E, K, L, R, H, INTER = 128, 8, 35, 16, 64, 48
MAX_TOKENS, MAX_SEQS = 8192, 256
GRAPHS = graph_batch_sizes(MAX_SEQS)
DRY = (*GRAPHS, *prefill_sizes(MAX_TOKENS, tuple(GRAPHS)))  # what the runner dry-runs (engine/precompile.py)


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
    dry = {}
    for t in DRY:
        dry.update(_keys(t, lora))
    steps = sorted({*range(1, 301), *range(257, MAX_TOKENS + 1, 37), 634, 1014, 1083, 1209, 4097, 8130, MAX_TOKENS})
    missed = {}
    for t in steps:
        for key, name in _keys(t, lora).items():
            if key not in dry:
                missed.setdefault(name, []).append(t)
    assert not missed, {name: ts[:5] for name, ts in missed.items()}


def _sgmv_keys(T: int, slots: list[int], pools: dict, meta: LoraMetaBuffers) -> dict:
    """{variant key: kernel name} of one step's LoRA launches: q/k/v, o, gate|up with the SiLU-and-mul, down."""
    with collect() as calls:
        m = meta.build(slots)
        for name, w in pools.items():
            x = torch.zeros(T, w.in_features, dtype=torch.bfloat16)
            y = torch.zeros(T, w.out_features, dtype=torch.bfloat16)
            (add_lora_silu_mul_triton if name == "gate_up" else add_lora_triton)(y, x, w, m)
    return {_variant(c): getattr(c[0], "__name__", "?") for c in calls}


def test_every_step_size_finds_its_sgmv_variants_precompiled():
    pools = {
        "qkv": make_pool(256, [256, 64, 64], torch.bfloat16, seed=0),
        "o": make_pool(256, [256], torch.bfloat16, seed=1),
        "gate_up": make_pool(256, [512, 512], torch.bfloat16, seed=2),
        "down": make_pool(512, [256], torch.bfloat16, seed=3),
    }
    meta = LoraMetaBuffers(MAX_TOKENS, 64, "cpu")
    dry = {}
    for t in DRY:
        dry.update(_sgmv_keys(t, [0] * t, pools, meta))
    missed = {}
    for pattern in ("distinct", "zipf", "identical", "skewed"):
        for t in sorted({*range(1, 301), *range(257, MAX_TOKENS + 1, 97), 1083, 8130}):
            slots = [s if s < 0 else s % 8 for s in token_slots(pattern, t, seed=t)]  # base rows stay -1
            for key, name in _sgmv_keys(t, slots, pools, meta).items():
                if key not in dry:
                    missed.setdefault((name, pattern), []).append(t)
    assert not missed, {k: ts[:5] for k, ts in missed.items()}
