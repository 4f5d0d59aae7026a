"""The fused expand + SiLU-and-mul (sgmv_silu.py, interpreter on CPU) against a float64 reference: every row of
h written (base rows too), y never modified, over adapter mixes, odd widths and per-slice ranks."""

from __future__ import annotations

import os

import pytest
import torch

from multilora_cli.kernels import LoraMetaBuffers, add_lora_silu_mul, build_lora_meta
from multilora_cli.kernels.blocks import ShrinkBlocks, SiluBlocks
from multilora_cli.kernels.reference import add_lora_reference
from tests.kernels.lora_cases import POPULARITY, make_pool, token_slots

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter tests (CPU only)")

TOL = {torch.float32: 1e-4, torch.float16: 1e-2}


@pytest.fixture(autouse=True)
def _force_triton(monkeypatch):
    monkeypatch.setenv("MULTILORA_KERNELS", "triton")


def _reference(y, x, w, ts) -> torch.Tensor:
    """silu(g) * u of (y + delta) in float64."""
    z = add_lora_reference(y, x, w, torch.tensor(ts))
    g, u = z.split(w.out_features // 2, dim=-1)
    return torch.nn.functional.silu(g) * u


def _run(width, ts, dtype=torch.float32, in_f=96, meta=None, seed=0, slot_ranks=None, max_rank=64, **kw):
    from multilora_cli.kernels.sgmv import add_lora_silu_mul_triton

    w = make_pool(in_f, [width, width], dtype, seed=seed, slot_ranks=slot_ranks, max_rank=max_rank)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(len(ts), in_f, generator=g).to(dtype)
    y = torch.randn(len(ts), 2 * width, generator=g).to(dtype)
    y0 = y.clone()
    h = add_lora_silu_mul_triton(y, x, w, meta or build_lora_meta(ts), **kw)
    assert torch.equal(y, y0), "the fused path must only read y"
    assert h.shape == (len(ts), width) and not torch.isnan(h).any(), "NaN: a read past a rank or of an unused slot"
    ref = _reference(y0, x, w, ts)
    err = (h.double() - ref).abs().max().item()
    assert err <= TOL[dtype] * max(ref.abs().max().item(), 1.0), f"max err {err:.3e}"
    return w, x, y0, h


@pytest.mark.parametrize("t", [1, 7, 133])
@pytest.mark.parametrize("pattern", POPULARITY)
def test_matches_reference(pattern, t):
    _run(80, token_slots(pattern, t, seed=t))


def test_fp16_and_base_rows_written_without_delta():
    ts = token_slots("uniform", 61, seed=4)  # some base rows (slot -1)
    _, _, y0, h = _run(48, ts, dtype=torch.float16)
    base = [i for i, s in enumerate(ts) if s < 0]
    assert base, "the pattern must include base rows"
    g, u = y0[base].float().split(48, dim=-1)
    want = (torch.nn.functional.silu(g).half().float() * u).half()  # F.silu rounds to the activation dtype
    assert torch.equal(h[base], want), "base rows: silu(g) * u of y, bit for bit"


@pytest.mark.parametrize("blocks", [SiluBlocks(bm=16, bn=32), SiluBlocks(bm=32, bn=64), SiluBlocks(bm=64, bn=16)])
def test_block_variants_and_split(blocks):
    """Widths that are no multiple of BN, several tiles per segment, K-split partials (3: no power of two)."""
    _run(72, token_slots("skewed", 90, seed=6), silu=blocks, shrink=ShrinkBlocks(bm=blocks.bm, bk=32, split=3))


def test_per_slice_ranks_and_unadapted_slices():
    """Slot 3 leaves `up` unadapted and slot 9 has a smaller rank on it (lora_cases.make_pool); a slot whose
    both slices are rank 0 still gets h = silu(g) * u."""
    _run(40, token_slots("distinct", 50, seed=2))
    w, x, y0, h = _run(40, [5, 5, -1, 3], slot_ranks={3: 16, 5: 8})
    w.rank[5].zero_()  # a slot adapting neither slice
    ts = [5, 5, -1, 3]
    from multilora_cli.kernels.sgmv import add_lora_silu_mul_triton

    h2 = add_lora_silu_mul_triton(y0.clone(), x, w, build_lora_meta(ts))
    torch.testing.assert_close(h2.double(), _reference(y0, x, w, ts), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("t", [64, 133])
def test_large_buckets_in_column_steps(t):
    """At 64-256 tokens the rank-32 / rank-64 buckets walk their BN columns in narrower steps
    (blocks.silu_bucket_columns): several real steps per CTA, a ragged last block, ranks 64, 40 (64 bucket), 24
    (32 bucket) and 8 in one rank-64 pool, next to the straight-line rank-16 CTAs."""
    from multilora_cli.kernels.blocks import silu_blocks, silu_bucket_columns

    bn = silu_blocks(t).bn
    assert silu_bucket_columns(bn, 64, t) < bn, "the case must take the stepped path"
    ts = token_slots("uniform", t, seed=t, slots=[0, 1, 2, 5])
    _run(2 * bn + 40, ts, slot_ranks={0: 64, 1: 40, 2: 24, 5: 8}, seed=t)


def test_up_rank_in_a_larger_bucket_than_gate():
    from multilora_cli.kernels.sgmv import add_lora_silu_mul_triton

    ts = token_slots("uniform", 33, seed=8, slots=[2])
    w = make_pool(64, [40, 40], torch.float32, slot_ranks={2: 48}, max_loras=4, seed=5)
    w.rank[2, 0] = 8  # gate in the 16 bucket, up (48) in the 64 bucket: the CTA must take the larger
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(33, 64, generator=g), torch.randn(33, 80, generator=g)
    h = add_lora_silu_mul_triton(y.clone(), x, w, build_lora_meta(ts))
    torch.testing.assert_close(h.double(), _reference(y, x, w, ts), rtol=1e-4, atol=1e-4)


def test_static_meta_buffers_every_mix():
    """LoraMetaBuffers (graph metadata: base tiles bounded, num_adapted read on the device), step after step."""
    bufs = LoraMetaBuffers(max_tokens=40, max_loras=12, device="cpu")
    for seed, (pattern, t) in enumerate([("zipf", 24), ("all-base", 40), ("distinct", 17), ("skewed", 40)]):
        ts = token_slots(pattern, t, seed=seed)
        _run(56, ts, meta=bufs.build(ts), seed=seed)


def test_dispatch_falls_back_for_pools_it_cannot_fuse():
    """Ranks above 64 (or unequal slices): add_lora then the activation, same values."""
    ts = token_slots("uniform", 20, seed=1)
    w = make_pool(64, [32, 32], torch.float32, slot_ranks={1: 100, 2: 8}, max_loras=4, max_rank=128, seed=3)
    ts = [1 if s >= 0 else -1 for s in ts]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 64, generator=g), torch.randn(20, 64, generator=g)
    ref = _reference(y, x, w, ts)
    h = add_lora_silu_mul(y, x, w, build_lora_meta(ts))
    torch.testing.assert_close(h.double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("blocks", [None, SiluBlocks(bm=16, bn=32)])
def test_dora_rows_scaled_before_the_activation(dtype, blocks):
    """With DoRA rows (w.dora) the fused kernel = the unfused path: add_lora, the DoRA scaling (kernels/dora.py),
    then silu(g) * u, bit for bit; base rows and a plain-LoRA slot (ones) as without DoRA."""
    from multilora_cli.kernels import add_lora, apply_dora
    from multilora_cli.kernels.sgmv import add_lora_silu_mul_triton

    width, in_f = 80, 96
    ts = token_slots("uniform", 45, seed=9)
    w = make_pool(in_f, [width, width], dtype, seed=3)
    w.enable_dora()
    g = torch.Generator().manual_seed(5)
    slots = sorted({s for s in ts if s >= 0})
    for s in slots[:-1]:  # the last adapted slot stays a plain LoRA
        w.dora[s] = torch.rand(2 * width, generator=g) + 0.5
    x = torch.randn(len(ts), in_f, generator=g).to(dtype)
    y = torch.randn(len(ts), 2 * width, generator=g).to(dtype)
    meta = build_lora_meta(ts)
    h = add_lora_silu_mul_triton(y.clone(), x, w, meta, silu=blocks)
    z = y.clone()
    add_lora(z, x, w, meta)
    apply_dora(z, w, meta)
    gate, up = z.float().split(width, dim=-1)
    want = (torch.nn.functional.silu(gate).to(dtype).float() * up).to(dtype)
    tol = TOL[dtype] * max(want.abs().max().item(), 1.0)
    assert (h.float() - want.float()).abs().max().item() <= tol
    plain = add_lora_silu_mul_triton(y.clone(), x, w.__class__(w.a, w.b, w.rank, w.scale, w.slice_offsets), meta)
    keep = [i for i, s in enumerate(ts) if s < 0 or s == slots[-1]]
    assert keep and torch.equal(h[keep], plain[keep]), "base rows and plain-LoRA rows: as without DoRA"
    moved = [i for i, s in enumerate(ts) if s in slots[:-1]]
    assert moved and not torch.equal(h[moved], plain[moved])
