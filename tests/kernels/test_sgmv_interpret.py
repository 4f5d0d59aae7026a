"""Triton SGMV kernels (interpreter on CPU) against the float64 reference, over adapter mixes and shapes."""

from __future__ import annotations

import os

import pytest
import torch

from multilora_cli.kernels import LoraMetaBuffers, add_lora, build_lora_meta
from multilora_cli.kernels.blocks import ExpandBlocks, ShrinkBlocks
from multilora_cli.kernels.reference import add_lora_reference
from tests.kernels.lora_cases import POPULARITY, assert_matches, make_pool, token_slots

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter tests (CPU only)")

QKV = (128, [256, 64, 64])  # in, q/k/v widths: GQA 4096/1024/1024 scaled down for the interpreter
TOL = {torch.float32: 1e-4, torch.float16: 1e-2}


@pytest.fixture(autouse=True)
def _force_triton(monkeypatch):
    monkeypatch.setenv("MULTILORA_KERNELS", "triton")


def _run(in_f, slices, dtype, ts, seed=0, meta=None, **kw):
    from multilora_cli.kernels.sgmv import add_lora_triton

    w = make_pool(in_f, slices, dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(len(ts), in_f, generator=g).to(dtype)
    y = torch.randn(len(ts), sum(slices), generator=g).to(dtype)
    y0 = y.clone()
    add_lora_triton(y, x, w, meta or build_lora_meta(ts), **kw)
    ref = add_lora_reference(y0, x, w, torch.tensor(ts))
    assert_matches(y, y0, ref, ts, w, TOL[dtype])


@pytest.mark.parametrize("t", [1, 7, 133])
@pytest.mark.parametrize("pattern", POPULARITY)
def test_add_lora_fp32(pattern, t):
    _run(*QKV, torch.float32, token_slots(pattern, t, seed=t))


@pytest.mark.parametrize("pattern", ["distinct", "zipf", "skewed", "identical"])
def test_add_lora_fp16(pattern):
    _run(*QKV, torch.float16, token_slots(pattern, 133, seed=3))


@pytest.mark.parametrize(
    "shrink,expand",
    [
        # split-K with several K steps per split (rank-64 slots: 64-bucket K step), several column steps per CTA
        (ShrinkBlocks(bm=16, bk=64, split=3), ExpandBlocks(bm=32, bn=32, nb=3)),
        # no split, bigger row tiles, one column step per CTA
        (ShrinkBlocks(bm=32, bk=128, split=1), ExpandBlocks(bm=16, bn=64, nb=1)),
    ],
)
def test_block_variants(shrink, expand):
    ts = token_slots("zipf", 70, seed=5)
    _run(*QKV, torch.float32, ts, shrink=shrink, expand=expand)


@pytest.mark.parametrize("vector_min_tokens", [0, 1 << 30])  # partials all loaded at once / summed one at a time
@pytest.mark.parametrize("after_shrink", [False, True])  # B and y loaded before or after the (no-op) wait
@pytest.mark.parametrize(
    "shrink",
    [
        ShrinkBlocks(
            bm=16, bk=32, split=8
        ),  # rank-64 slots: [8, 16, 64] partials exceed S_VECTOR_MAX: summed in a loop
        ShrinkBlocks(bm=16, bk=32, split=3),  # a split that is no power of two: the vector load masks partial 3
        ShrinkBlocks(bm=16, bk=32, split=2),  # [2, 16, 64]: one vector load
    ],
)
def test_expand_partial_sums_and_early_loads(shrink, after_shrink, vector_min_tokens):
    """Every way the expand sums the shrink's K-split partials, for one-column-block CTAs (straight-line code)
    and column loops: the same result."""
    import multilora_cli.kernels.sgmv_expand as sgmv_expand
    from multilora_cli.kernels.sgmv_shrink import lora_shrink

    ts = token_slots("zipf", 45, seed=11)
    w = make_pool(*QKV, torch.float32, seed=2)
    g = torch.Generator().manual_seed(3)
    x, y0 = torch.randn(len(ts), QKV[0], generator=g), torch.randn(len(ts), sum(QKV[1]), generator=g)
    meta = build_lora_meta(ts)
    s = torch.empty((shrink.split, len(ts), w.n_slices, w.max_rank))
    lora_shrink(x, w, meta, s, shrink)
    ref = add_lora_reference(y0, x, w, torch.tensor(ts))
    for expand in (ExpandBlocks(bm=16, bn=64, nb=1), ExpandBlocks(bm=16, bn=32, nb=3)):
        y = y0.clone()
        sgmv_expand.lora_expand(s, w, meta, y, expand, after_shrink=after_shrink, vector_min_tokens=vector_min_tokens)
        assert_matches(y, y0, ref, ts, w, TOL[torch.float32])


@pytest.mark.parametrize(
    "max_rank,slot_ranks",
    [
        (16, {0: 16, 2: 3, 5: 9}),  # only the 16 bucket is compiled
        (32, {1: 32, 2: 17, 4: 5}),  # 16 and 32 buckets
        (128, {1: 100, 3: 64, 6: 65, 7: 2}),  # ranks above 64: extra shrink chunks, chunked expand
    ],
)
def test_pool_max_ranks(max_rank, slot_ranks):
    from multilora_cli.kernels.sgmv import add_lora_triton

    in_f, slices = 64, [96, 32, 32]
    w = make_pool(in_f, slices, torch.float32, slot_ranks=slot_ranks, max_loras=8, max_rank=max_rank, seed=max_rank)
    ts = token_slots("uniform", 37, seed=max_rank, slots=list(slot_ranks))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(37, in_f, generator=g), torch.randn(37, sum(slices), generator=g)
    y0 = y.clone()
    add_lora_triton(y, x, w, build_lora_meta(ts), shrink=ShrinkBlocks(bm=16, bk=32, split=2))
    assert_matches(y, y0, add_lora_reference(y0, x, w, torch.tensor(ts)), ts, w, TOL[torch.float32])


@pytest.mark.parametrize("in_f,slices", [(160, [96]), (96, [200, 200]), (200, [40, 24, 24])])
def test_other_projections(in_f, slices):
    """o/down (one slice), gate_up (two), widths that are not multiples of the blocks."""
    _run(in_f, slices, torch.float32, token_slots("uniform", 29, seed=7))


def test_shrink_writes_exactly_the_adapted_entries():
    from multilora_cli.kernels.sgmv_shrink import lora_shrink

    ts = token_slots("skewed", 40, seed=2)
    w = make_pool(*QKV, torch.float32)
    x = torch.randn(40, QKV[0])
    blocks = ShrinkBlocks(bm=16, bk=32, split=2)
    s = torch.full((2, 40, 3, 64), float("nan"))
    lora_shrink(x, w, build_lora_meta(ts), s, blocks)
    for t, slot in enumerate(ts):
        for i in range(3):
            r = int(w.rank[slot, i]) if slot >= 0 else 0
            assert torch.isnan(s[:, t, i, r:]).all(), f"token {t} slice {i}: wrote past rank {r}"
            if r:
                got = s[:, t, i, :r].sum(0).double()
                want = float(w.scale[slot, i]) * (x[t].double() @ w.a[slot, i, :r].double().T)
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_static_meta_buffers_match_fresh_meta():
    """LoraMetaBuffers (fixed-capacity, reused) drives the kernels exactly like build_lora_meta, step after step."""
    bufs = LoraMetaBuffers(max_tokens=40, max_loras=12, device="cpu")
    for seed, (pattern, t) in enumerate([("zipf", 24), ("all-base", 40), ("distinct", 17)]):
        ts = token_slots(pattern, t, seed=seed)
        _run(*QKV, torch.float32, ts, seed=seed, meta=bufs.build(ts))


def test_add_lora_dispatch_uses_triton_when_forced(monkeypatch):
    import multilora_cli.kernels.sgmv as sgmv

    calls = []
    real = sgmv.add_lora_triton
    monkeypatch.setattr(sgmv, "add_lora_triton", lambda *a, **k: (calls.append(1), real(*a, **k)))
    ts = token_slots("uniform", 9, seed=1)
    w = make_pool(*QKV, torch.float32)
    x, y = torch.randn(9, QKV[0]), torch.zeros(9, sum(QKV[1]))
    add_lora(y, x, w, build_lora_meta(ts))
    assert calls == [1]
    ref = add_lora_reference(torch.zeros(9, 384), x, w, torch.tensor(ts))
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
