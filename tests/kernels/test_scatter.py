"""scatter_blocks (one-launch slot load) against torch copies: transposed, 3-D, multi-chunk, other allocations."""

from __future__ import annotations

import os

import pytest
import torch

from multilora_cli.kernels.scatter import CHUNK, scatter_blocks, scatter_plan, scatter_reference

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="Triton needs the interpreter or a GPU",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(dtype):
    g = torch.Generator().manual_seed(0)
    # destinations in several allocations, like the slot tensors of different LoRA modules
    a = torch.full((3, 2, 16, 40), float("nan"), dtype=dtype, device=DEVICE)  # [slots, slices, R, in]
    b_store = torch.full((3, 16, CHUNK + 37), float("nan"), dtype=dtype, device=DEVICE)  # rank-major [slots, R, out]
    b = b_store.transpose(1, 2)  # logical [slots, out, R]
    small = torch.full((5, 7), float("nan"), dtype=dtype, device=DEVICE)
    r = 9  # a rank below the pool's 16: strided destinations
    dst = [a[1, :, :r], b[2, :, :r], small[1:4, 2:6]]
    shapes = [tuple(d.shape) for d in dst]
    total = sum(torch.Size(sh).numel() for sh in shapes)
    src_base = torch.randn(total + 11, generator=g).to(dtype).to(DEVICE)
    src, off = [], 5
    for sh in shapes:
        n = torch.Size(sh).numel()
        src.append(src_base[off : off + n].view(sh))
        off += n
    return dst, src, src_base, (a, b_store, small)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("base_index", [0, 1, 2])  # offsets from any allocation, negative ones included
def test_scatter_matches_copies(dtype, base_index):
    dst, src, src_base, bufs = _case(dtype)
    want = [t.clone() for t in bufs]
    scatter_reference([w for w in _views(want)], src)
    plan = scatter_plan(dst, src, src_base, bufs[base_index])
    assert plan.shape[0] > len(dst)  # the transposed block spans several chunks
    scatter_blocks(src_base, bufs[base_index], plan)
    for got, exp in zip(bufs, want):
        assert torch.equal(torch.nan_to_num(got, nan=7.0), torch.nan_to_num(exp, nan=7.0))  # untouched stays NaN


def _views(bufs):
    a, b_store, small = bufs
    return [a[1, :, :9], b_store.transpose(1, 2)[2, :, :9], small[1:4, 2:6]]


def test_plan_rejects_mismatched_pairs():
    dst, src, src_base, bufs = _case(torch.float32)
    with pytest.raises(ValueError):
        scatter_plan([dst[0]], [src[1]], src_base, bufs[0])


@pytest.mark.parametrize("slot", [0, 2])
def test_one_plan_serves_every_slot(slot):
    """A plan built on slot 0's views with each tensor's slot stride as its step, launched with shift=slot, writes
    exactly slot `slot` (what the slot writer caches once per layout, whatever the pool's size)."""
    dst, src, src_base, (a, b_store, small) = _case(torch.float32)
    b = b_store.transpose(1, 2)
    zero = [a[0, :, :9], b[0, :, :9]]
    plan = scatter_plan(zero, src[:2], src_base, a, steps=[a.stride(0), b.stride(0)])
    want_a, want_b = a.clone(), b_store.clone()
    scatter_reference([want_a[slot, :, :9], want_b.transpose(1, 2)[slot, :, :9]], src[:2])
    scatter_blocks(src_base, a, plan, shift=slot)
    for got, exp in ((a, want_a), (b_store, want_b)):
        assert torch.equal(torch.nan_to_num(got, nan=7.0), torch.nan_to_num(exp, nan=7.0))
    with pytest.raises(ValueError):
        scatter_plan(zero, src[:2], src_base, a, steps=[1])
