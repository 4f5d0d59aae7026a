"""kernels/overlap.py on a GPU: the shrink on a side stream beside the base matmul gives the same bits as the
one-stream path, eagerly and inside a CUDA graph replayed with new metadata (what a decode graph does)."""

from __future__ import annotations

import pytest
import torch

from lora_cases import token_slots
from multilora_cli.kernels import LoraMetaBuffers
from multilora_cli.layers.context import StepContext, reset_context, set_context
from multilora_cli.layers.lora import LoRALinear

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _layer(in_f: int, slices: list[int], seed: int) -> LoRALinear:
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            m = LoRALinear(in_f, slices, max_loras=16, max_rank=16)
    finally:
        torch.set_default_dtype(torch.float32)
    m.weight.data.normal_(0, in_f ** -0.5)
    w = m.lora
    w.a.normal_(0, in_f ** -0.5)
    w.b.normal_(0, 0.1)
    w.rank.copy_(torch.tensor([[r] * len(slices) for r in [16, 8, 1, 16] * 4], dtype=w.rank.dtype))
    w.rank[5, -1] = 0  # an unadapted slice
    w.scale.fill_(2.0)
    return m


def _ctx(t: int, meta, side) -> StepContext:
    z = torch.zeros(t, dtype=torch.int32, device="cuda")
    return StepContext(is_prefill=False, slot_mapping=z.long(), seqlens_q=[1] * t, seqlens_k=[1] * t,
                       context_lens=z, block_tables=z.view(t, 1), lora=meta, lora_stream=side)


def _run(m: LoRALinear, x, ctx, silu: bool):
    set_context(ctx)
    try:
        return m.forward_silu_mul(x) if silu else m(x)
    finally:
        reset_context()


@pytest.mark.parametrize("silu", [False, True], ids=["qkv", "gate_up-silu"])
@pytest.mark.parametrize("pattern,t", [("zipf", 133), ("distinct", 64), ("one-token", 7), ("all-base", 16)])
def test_side_stream_shrink_is_bit_identical_eager(silu, pattern, t):
    slices = [384, 384] if silu else [512, 128, 128]
    m = _layer(512, slices, seed=t)
    x = torch.randn(t, 512, device="cuda", dtype=torch.bfloat16)
    bufs = LoraMetaBuffers(t, 16, "cuda")
    meta = bufs.build(token_slots(pattern, t, seed=1, slots=range(16)))
    one = _run(m, x, _ctx(t, meta, None), silu)
    two = _run(m, x, _ctx(t, meta, torch.cuda.Stream()), silu)
    torch.cuda.synchronize()
    assert torch.equal(one, two)


@pytest.mark.parametrize("silu", [False, True], ids=["qkv", "gate_up-silu"])
def test_side_stream_shrink_in_a_graph_replays_new_metadata(silu):
    t = 96
    slices = [384, 384] if silu else [512, 128, 128]
    m = _layer(512, slices, seed=4)
    x = torch.randn(t, 512, device="cuda", dtype=torch.bfloat16)
    bufs = LoraMetaBuffers(t, 16, "cuda")
    side = torch.cuda.Stream()
    ctx = _ctx(t, bufs.build(token_slots("uniform", t, seed=2, slots=range(16))), side)
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        _run(m, x, ctx, silu)
    torch.cuda.current_stream().wait_stream(warm)
    g = torch.cuda.CUDAGraph()
    set_context(ctx)
    try:
        with torch.cuda.graph(g):
            out = m.forward_silu_mul(x) if silu else m(x)
    finally:
        reset_context()
    for seed, pattern in enumerate(("zipf", "skewed", "identical", "all-base")):
        slots = token_slots(pattern, t, seed=seed, slots=range(16))
        meta = bufs.build(slots)  # same buffers: the graph reads the new step's metadata
        g.replay()
        want = _run(m, x, _ctx(t, meta, None), silu)
        torch.cuda.synchronize()
        assert torch.equal(out, want), pattern
