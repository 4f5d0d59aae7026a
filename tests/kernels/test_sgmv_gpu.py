"""Triton SGMV on a real GPU: bf16 at Llama-3-8B shapes vs the float64 reference, CUDA-graph replay, no sync."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels import LoraMetaBuffers, add_lora, build_lora_meta
from multilora_cli.kernels.reference import add_lora_reference
from tests.kernels.lora_cases import make_pool, token_slots

pytestmark = pytest.mark.gpu

LLAMA3_8B = {  # module: (in_features, packed output slices)
    "qkv": (4096, [4096, 1024, 1024]),
    "o": (4096, [4096]),
    "gate_up": (4096, [14336, 14336]),
    "down": (14336, [4096]),
}


def _case(in_f, slices, dtype, ts, seed=0):
    w = make_pool(in_f, slices, dtype, device="cuda", seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(len(ts), in_f, generator=g).to(dtype).cuda()
    y = torch.randn(len(ts), sum(slices), generator=g).to(dtype).cuda()
    return w, x, y


def _check(out, y0, w, x, ts, tol):
    ref = add_lora_reference(y0, x, w, torch.tensor(ts))
    assert not torch.isnan(out).any(), "NaN leaked: a kernel read past a rank or an unused slot"
    ranks = w.rank.cpu()
    touched = torch.zeros(out.shape, dtype=torch.bool)
    for t, s in enumerate(ts):
        for i in range(w.n_slices):
            if s >= 0 and ranks[s, i] > 0:
                touched[t, w.slice_offsets[i] : w.slice_offsets[i + 1]] = True
    touched = touched.cuda()
    assert torch.equal(out[~touched], y0[~touched]), "base rows / unadapted slices must be untouched bit-for-bit"
    if touched.any():
        delta = (ref - y0.double())[touched]
        rel = ((out.double() - ref)[touched].norm() / delta.norm()).item()
        assert rel < tol, f"relative error {rel:.2e}"


@pytest.mark.parametrize("module", list(LLAMA3_8B))
@pytest.mark.parametrize(
    "pattern,t", [("one-token", 1), ("distinct", 7), ("zipf", 133), ("skewed", 300), ("uniform", 2048)]
)
def test_bf16_llama3_8b_shapes(module, pattern, t):
    in_f, slices = LLAMA3_8B[module]
    ts = token_slots(pattern, t, seed=t)
    w, x, y = _case(in_f, slices, torch.bfloat16, ts)
    y0 = y.clone()
    add_lora(y, x, w, build_lora_meta(ts, "cuda"))
    _check(y, y0, w, x, ts, 1e-2)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 1e-2), (torch.float32, 1e-5)])
def test_other_dtypes(dtype, tol):
    ts = token_slots("uniform", 77, seed=1)
    w, x, y = _case(512, [512, 128, 128], dtype, ts)
    y0 = y.clone()
    add_lora(y, x, w, build_lora_meta(ts, "cuda"))
    _check(y, y0, w, x, ts, tol)


def test_cuda_graph_replays_any_adapter_mix():
    """Capture with one batch (even all-base), replay with others: fixed buffers + static grid bound."""
    in_f, slices = 1024, [1024, 256, 256]
    bufs = LoraMetaBuffers(max_tokens=96, max_loras=12, device="cuda")
    w, x, y = _case(in_f, slices, torch.bfloat16, [0] * 96)
    y_static = torch.empty_like(y)
    meta = bufs.build(token_slots("all-base", 96))
    add_lora(y_static, x, w, meta)  # warm up (compile) outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        add_lora(y_static, x, w, meta)
    for seed, pattern in enumerate(["zipf", "distinct", "skewed", "all-base", "identical"]):
        ts = token_slots(pattern, 96, seed=seed)
        bufs.build(ts)
        y_static.copy_(y)
        g.replay()
        torch.cuda.synchronize()
        _check(y_static, y, w, x, ts, 1e-2)


def test_add_lora_never_syncs_the_host():
    ts = token_slots("zipf", 64, seed=3)
    w, x, y = _case(1024, [1024, 256, 256], torch.bfloat16, ts)
    meta = build_lora_meta(ts, "cuda")
    add_lora(y, x, w, meta)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        add_lora(y, x, w, meta)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _chain(ws, x, ys, meta):
    """Four dependent LoRA layers with their kernels back to back: layer i's output is layer i+1's input, so a
    shrink that read x before the previous expand finished, or an expand that read s or y early, changes the
    bits. Layer 2's input first passes through a plain torch kernel (a predecessor launched without PDL), and
    its y is written by the launch right before its shrink (the expand loads y before its own wait)."""
    outs = [y.clone() for y in ys]  # copies first, so expand(i) -> shrink(i+1) are adjacent launches
    h = x
    for i, (w, out) in enumerate(zip(ws, outs)):
        if i == 2:
            h = h * 2.0  # exact in bf16
            out = ys[i] * 2.0  # y's producer is the shrink's predecessor
        add_lora(out, h, w, meta)
        h = out
    return h


@pytest.mark.parametrize("graph", [False, True])
def test_pdl_modes_are_bit_identical(graph):
    """PDL launches (with and without the L2 prefetch) change timing only: every mode gives the same bits."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90+")
    from multilora_cli.kernels import pdl

    t, d = 256, 1024
    ws = [make_pool(d, [d], torch.bfloat16, device="cuda", seed=s) for s in range(3)]
    ws.append(make_pool(d, [512, 256, 256], torch.bfloat16, device="cuda", seed=3))
    g = torch.Generator().manual_seed(7)
    x = torch.randn(t, d, generator=g).to(torch.bfloat16).cuda()
    ys = [torch.randn(t, w.out_features, generator=g).to(torch.bfloat16).cuda() for w in ws]
    bufs = LoraMetaBuffers(max_tokens=t, max_loras=12, device="cuda")
    patterns = ["zipf", "distinct", "all-base", "skewed"]
    outs = {}
    try:
        for mode in (pdl.OFF, pdl.PdlMode(launch=True), pdl.PdlMode(launch=True, prefetch=True)):
            pdl.force(mode)
            assert pdl.pdl_mode(x.device, t) == mode, "PDL is not available here: the test would prove nothing"
            meta = bufs.build(token_slots("uniform", t, seed=0))
            res = []
            if graph:
                _chain(ws, x, ys, meta)  # compile outside capture
                torch.cuda.synchronize()
                cg = torch.cuda.CUDAGraph()
                with torch.cuda.graph(cg):
                    static = _chain(ws, x, ys, meta)
                for seed, pattern in enumerate(patterns):
                    bufs.build(token_slots(pattern, t, seed=seed))
                    cg.replay()
                    res.append(static.clone())
            else:
                for seed, pattern in enumerate(patterns):
                    res.append(_chain(ws, x, ys, bufs.build(token_slots(pattern, t, seed=seed))))
            torch.cuda.synchronize()
            outs[mode] = res
    finally:
        pdl.force(None)
    ref = outs[pdl.OFF]
    assert not any(torch.isnan(r).any() for r in ref)
    for mode, res in outs.items():
        for pattern, a, b in zip(patterns, res, ref):
            assert torch.equal(a, b), f"{mode} differs from PDL off on pattern {pattern}"


def _silu_inputs(t, seed=0):
    in_f, slices = LLAMA3_8B["gate_up"]
    w = make_pool(in_f, slices, torch.bfloat16, device="cuda", seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(t, in_f, generator=g).to(torch.bfloat16).cuda()
    y = torch.randn(t, sum(slices), generator=g).to(torch.bfloat16).cuda()
    return w, x, y


def _unfused(y, x, w, meta):
    from multilora_cli.kernels import norm_rope

    y = y.clone()
    add_lora(y, x, w, meta)
    return norm_rope.silu_mul(y)


@pytest.mark.parametrize(
    "pattern,t", [("one-token", 1), ("uniform", 133), ("all-base", 64), ("skewed", 300), ("zipf", 2048)]
)
def test_fused_silu_bf16_matches_reference_and_unfused_bits(pattern, t):
    """gate_up at Llama-3-8B shapes: within bf16 error of float64, and bit-identical to add_lora + silu_mul."""
    from multilora_cli.kernels import add_lora_silu_mul

    ts = token_slots(pattern, t, seed=t)
    w, x, y = _silu_inputs(t)
    meta = build_lora_meta(ts, "cuda")
    y0 = y.clone()
    h = add_lora_silu_mul(y, x, w, meta)
    assert torch.equal(y, y0), "the fused path only reads y"
    z = add_lora_reference(y0, x, w, torch.tensor(ts))
    gate, up = z.split(w.out_features // 2, dim=-1)
    ref = torch.nn.functional.silu(gate) * up
    rel = ((h.double() - ref).norm() / ref.norm()).item()
    assert rel < 1e-2, f"relative error {rel:.2e}"
    assert torch.equal(h, _unfused(y0, x, w, meta)), "fused and unfused paths must round alike"


@pytest.mark.parametrize("graph", [False, True])
def test_fused_silu_pdl_modes_and_graph_replays_are_bit_identical(graph):
    """Every PDL mode, eager or replayed over other adapter mixes (base rows included), with y written by the
    launch right before the shrink: the same bits as the unfused path."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90+")
    from multilora_cli.kernels import add_lora_silu_mul, pdl

    t = 256
    w, x, y = _silu_inputs(t, seed=4)
    bufs = LoraMetaBuffers(max_tokens=t, max_loras=12, device="cuda")
    patterns = ["zipf", "all-base", "distinct", "skewed"]

    def step(meta):
        return add_lora_silu_mul(y * 1.0, x, w, meta)  # y's producer is the shrink's predecessor

    try:
        for mode in (pdl.OFF, pdl.PdlMode(launch=True), pdl.PdlMode(launch=True, prefetch=True)):
            pdl.force(mode)
            meta = bufs.build(token_slots("uniform", t, seed=0))
            if graph:
                step(meta)  # compile outside capture
                torch.cuda.synchronize()
                cg = torch.cuda.CUDAGraph()
                with torch.cuda.graph(cg):
                    static = step(meta)
            for seed, pattern in enumerate(patterns):
                ts = token_slots(pattern, t, seed=seed)
                meta = bufs.build(ts)
                if graph:
                    cg.replay()
                    h = static.clone()
                else:
                    h = step(meta)
                torch.cuda.synchronize()
                assert torch.equal(h, _unfused(y, x, w, meta)), f"{mode} graph={graph} differs on {pattern}"
    finally:
        pdl.force(None)
