"""`kernels/fused_moe.py` on a real GPU: bf16 at Qwen3-30B-A3B expert shapes vs moe_reference in fp32, fp32 exact,
CUDA-graph capture + replay with another routing and adapter mix, and no host sync, through both LoRA paths
(per-adapter dot epilogues in the base GEMMs, and grouped launches; skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels.fused_moe import fused_moe
from multilora_cli.kernels.moe_reference import moe_reference, route
from tests.kernels.moe_cases import expert_lora, routing

pytestmark = pytest.mark.gpu

H, INTER, E, K = 2048, 768, 128, 8  # Qwen3-30B-A3B
L, R = 8, 16
RANKS = (16, 8, 0, 4, 16, 16, 12, 16)
PATHS = {"rows": dict(row_lora=True), "grouped": dict(row_lora=False)}


def _case(T, pattern, dtype, seed=0, h=H, inter=INTER, e=E, k=K):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, h, generator=g).to(dtype).cuda()
    gate_up = (torch.randn(e, 2 * inter, h, generator=g) * 0.02).to(dtype).cuda()
    down = (torch.randn(e, h, inter, generator=g) * 0.02).to(dtype).cuda()
    weights, experts = routing(pattern, T, e, k, g)
    slot = torch.randint(-1, L, (T,), generator=g).cuda()
    lora = expert_lora(L, R, e, h, inter, RANKS, g, dtype, "cuda", amp=0.05)
    return x, weights.cuda(), experts.cuda(), gate_up, down, slot, lora


def _fp32(lora):
    return type(lora)(
        *(getattr(lora, n).float() if n not in ("rank", "shared") else getattr(lora, n) for n in lora.__slots__)
    )


def _rel(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@pytest.mark.parametrize("pattern", ["one", "uniform", "sparse"])
@pytest.mark.parametrize("T", [1, 16, 64, 300, 2048])
def test_bf16_qwen3_30b_shapes(pattern, T):
    x, w, idx, gu, dn, slot, lora = _case(T, pattern, torch.bfloat16, seed=T)
    got = fused_moe(x, w, idx, gu, dn, slot, lora)
    want = moe_reference(x.float(), w, idx, gu.float(), dn.float(), slot, _fp32(lora))
    assert not torch.isnan(got).any()
    assert _rel(got, want) < 2e-2  # bf16 rounds h, act and y on the way
    base = fused_moe(x, w, idx, gu, dn)
    want_base = moe_reference(x.float(), w, idx, gu.float(), dn.float())
    assert _rel(base, want_base) < 2e-2
    assert _rel(want, want_base) > 0.1  # the LoRA changed the output beyond the tolerance


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("T", [64, 300, 4096])
def test_bf16_both_lora_paths(path, T):
    """The dot epilogues (decode-sized steps) and the grouped launches (prefill-sized) at the same shapes."""
    x, w, idx, gu, dn, slot, lora = _case(T, "uniform", torch.bfloat16, seed=T + 7)
    got = fused_moe(x, w, idx, gu, dn, slot, lora, **PATHS[path])
    want = moe_reference(x.float(), w, idx, gu.float(), dn.float(), slot, _fp32(lora))
    assert _rel(got, want) < 2e-2


@pytest.mark.parametrize("path", PATHS)
def test_fp32_equals_reference(path):
    x, w, idx, gu, dn, slot, lora = _case(77, "uniform", torch.float32, seed=1, h=256, inter=192, e=16, k=4)
    got = fused_moe(x, w, idx, gu, dn, slot, lora, **PATHS[path])
    torch.testing.assert_close(got, moe_reference(x, w, idx, gu, dn, slot, lora), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("path", PATHS)
def test_cuda_graph_replays_another_routing_and_adapter_mix(path):
    T = 64
    x, w, idx, gu, dn, slot, lora = _case(T, "uniform", torch.bfloat16, seed=2)
    x2, w2, idx2, _, _, slot2, _ = _case(T, "one", torch.bfloat16, seed=3)
    fused_moe(x, w, idx, gu, dn, slot, lora, **PATHS[path])  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # any host sync inside raises here
        out = fused_moe(x, w, idx, gu, dn, slot, lora, **PATHS[path])
    for src, dst in ((x2, x), (w2, w), (idx2, idx), (slot2, slot)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    want = fused_moe(x2, w2, idx2, gu, dn, slot2, lora, **PATHS[path])
    assert torch.equal(out, want)


def test_model_router_weights_in_bf16():
    """Qwen's router gives bf16 weights (route()), Mixtral's fp32: both accepted."""
    x, _, _, gu, dn, slot, lora = _case(33, "uniform", torch.bfloat16, seed=4)
    router = torch.randn(E, H, device="cuda", dtype=torch.bfloat16) * 0.02
    for kind in ("qwen", "mixtral"):
        w, idx = route(x @ router.T, K, kind, True)
        got = fused_moe(x, w, idx, gu, dn, slot, lora)
        want = moe_reference(x.float(), w.float(), idx, gu.float(), dn.float(), slot, _fp32(lora))
        assert _rel(got, want) < 2e-2  # bf16 rounds h, act and y on the way


@pytest.mark.parametrize("T", [16, 300, 4096])
def test_row_path_pdl_chain_is_bit_identical(T):
    """The row path's shrink -> gate_up -> sum_parts -> down chained with PDL (the GEMMs' main loops before their
    waits) gives the same bits as plain launches, eagerly and replayed from a CUDA graph."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90+")
    from multilora_cli.kernels.fused_moe import row_pdl

    assert row_pdl(torch.device("cuda"), T * K).launch  # on by default at these sizes
    x, w, idx, gu, dn, slot, lora = _case(T, "uniform", torch.bfloat16, seed=T + 11)
    plain = fused_moe(x, w, idx, gu, dn, slot, lora, row_lora=True, pdl=False)
    chained = fused_moe(x, w, idx, gu, dn, slot, lora, row_lora=True, pdl=True)
    assert torch.equal(plain, chained)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w, idx, gu, dn, slot, lora, row_lora=True, pdl=True)
    x2, w2, idx2, _, _, slot2, _ = _case(T, "sparse", torch.bfloat16, seed=T + 12)
    for src, dst in ((x2, x), (w2, w), (idx2, idx), (slot2, slot)):
        dst.copy_(src)
    for _ in range(3):  # replays back to back: each one's chain starts behind the previous one's last launch
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fused_moe(x2, w2, idx2, gu, dn, slot2, lora, row_lora=True, pdl=False))
