"""scatter_blocks (a slot load in at most three launches) against torch copies: consecutive, transposed and
strided blocks, 3-D, multi-chunk and multi-tile, aligned and unaligned offsets, other allocations."""

from __future__ import annotations

import os

import pytest
import torch

from multilora_cli.kernels.scatter import (
    ALIGN,
    CHUNK,
    TILE_C,
    TILE_R,
    ScatterPlan,
    scatter_blocks,
    scatter_plan,
    scatter_reference,
)

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="Triton needs the interpreter or a GPU",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
R = 32  # the pool's max rank


def _case(dtype, rank: int, aligned: bool):
    """Destinations in several allocations, like the slot tensors of different LoRA modules: A [slots, slices, R,
    in] (consecutive blocks), rank-major B [slots, R, out] seen as [slots, out, R] (transposed blocks), and a
    sub-matrix (strided). `aligned`: offsets and strides multiples of 8 elements (the vector tables), else not."""
    g = torch.Generator().manual_seed(0)
    pad = 0 if aligned else 3
    a = torch.full((3, 2, R, 40), float("nan"), dtype=dtype, device=DEVICE)
    b_store = torch.full((3, R, TILE_R + 40 + pad), float("nan"), dtype=dtype, device=DEVICE)
    b = b_store.transpose(1, 2)  # logical [slots, out, R]
    small = torch.full((5, 7), float("nan"), dtype=dtype, device=DEVICE)
    dst = [a[1, :, :rank], b[2, :, :rank], small[1:4, 2:6]]
    total = sum(d.numel() + 8 for d in dst)
    src_base = torch.randn(total + 16, generator=g).to(dtype).to(DEVICE)
    src, off = [], 8 if aligned else 5
    for d in dst:
        src.append(src_base[off : off + d.numel()].view(d.shape))
        off += -(-d.numel() // 8) * 8 if aligned else d.numel()
    return dst, src, src_base, (a, b_store, small)


def _views(bufs, rank):
    a, b_store, small = bufs
    return [a[1, :, :rank], b_store.transpose(1, 2)[2, :, :rank], small[1:4, 2:6]]


def _same(got, want):
    return torch.equal(torch.nan_to_num(got, nan=7.0), torch.nan_to_num(want, nan=7.0))  # untouched stays NaN


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("base_index", [0, 1, 2])  # offsets from any allocation, negative ones included
@pytest.mark.parametrize("rank,aligned", [(R, True), (16, True), (9, True), (16, False)])
def test_scatter_matches_copies(dtype, base_index, rank, aligned):
    dst, src, src_base, bufs = _case(dtype, rank, aligned)
    want = [t.clone() for t in bufs]
    scatter_reference(_views(want, rank), src)
    plan = scatter_plan(dst, src, src_base, bufs[base_index])
    # which table each block went to: A consecutive, B transposed (a rank of 8k columns), the sub-matrix strided
    vector = aligned and rank % 8 == 0
    assert (plan.flat.shape[0] > 0) == aligned
    assert plan.transposed.shape[0] == (-(-(TILE_R + 40) // TILE_R) * -(-rank // TILE_C) if vector else 0)
    a_rows = 0 if aligned else 2  # A: 2 blocks of one chunk each
    b_rows = 0 if vector else -(-(TILE_R + 40) * rank // CHUNK)
    assert plan.strided.shape[0] == 1 + a_rows + b_rows
    scatter_blocks(src_base, bufs[base_index], plan)
    for got, exp in zip(bufs, want):
        assert _same(got, exp)


def test_chunks_and_tiles_split_large_blocks():
    """A consecutive block over several CHUNKs, a transposed one over several row and column tiles."""
    dtype = torch.float32
    a = torch.full((2, CHUNK * 2 + 40), float("nan"), dtype=dtype, device=DEVICE)
    b_store = torch.full((2 * TILE_C, 2 * TILE_R + 8), float("nan"), dtype=dtype, device=DEVICE)
    dst = [a[1:2, 8:], b_store.t()]  # one row of 2 * CHUNK + 32; [2 * TILE_R + 8, 2 * TILE_C] transposed
    src_base = torch.randn(sum(d.numel() for d in dst) + 8, dtype=dtype, device=DEVICE)
    src = [src_base[: dst[0].numel()].view(dst[0].shape)]
    src.append(src_base[dst[0].numel() : dst[0].numel() + dst[1].numel()].view(dst[1].shape))
    want_a, want_b = a.clone(), b_store.clone()
    scatter_reference([want_a[1:2, 8:], want_b.t()], src)
    plan = scatter_plan(dst, src, src_base, a)
    assert plan.flat.shape[0] == 3 and plan.transposed.shape[0] == 3 * 2 and plan.strided.shape[0] == 0
    scatter_blocks(src_base, a, plan)
    assert _same(a, want_a) and _same(b_store, want_b)


@pytest.mark.parametrize("rank", [16, 9])
def test_expert_b_merges_into_one_transposed_block(rank):
    """PEFT's MoE lora_B [out, r, E] (contiguous) into [E, out, R] expert slots: at the pool's rank its leading
    dims merge, so the copy is whole [TILE_R, TILE_C] tiles of one [out * r, E] block; below it, one [r, E] block
    per out row (element-wise here: 9 rows are not whole 8-element runs)."""
    out, e, r_pool = 40, 24, 16
    store = torch.full((3, e, out, r_pool), float("nan"), device=DEVICE)  # [slots, E, out, R]
    dst = store[1, :, :, :rank].permute(1, 2, 0)  # [out, r, E]
    src_base = torch.randn(dst.numel() + 8, device=DEVICE)
    src = src_base[8 : 8 + dst.numel()].view(dst.shape)
    want = store.clone()
    scatter_reference([want[1, :, :, :rank].permute(1, 2, 0)], [src])
    plan = scatter_plan([dst], [src], src_base, store)
    if rank == r_pool:
        assert plan.transposed.shape[0] == -(-out * rank // TILE_R) * -(-e // TILE_C) and plan.strided.shape[0] == 0
    else:
        assert plan.transposed.shape[0] == 0 and plan.strided.shape[0] == out  # [r, E] blocks of 9 rows
    scatter_blocks(src_base, store, plan)
    assert _same(store, want)


def _hints_hold(plan) -> bool:
    """Every value the vector kernels hint as a multiple of ALIGN is one (a false hint would corrupt a slot)."""
    f, t = plan.flat.cpu(), plan.transposed.cpu()
    return bool((f % ALIGN == 0).all()) and bool((t % ALIGN == 0).all())  # every column of both tables


def test_random_layouts_match_copies_and_keep_the_hints():
    """Random 2-D / 3-D, permuted and padded destination views of several allocations, sources at aligned or
    unaligned offsets, launched at shifts 0-2: every table against torch copies, every hint true."""
    g = torch.Generator().manual_seed(1)

    def pick(hi: int, whole: bool) -> int:  # whole: a multiple of 8 (the vector tables' runs)
        return (
            8 * int(torch.randint(1, hi // 8 + 1, (1,), generator=g))
            if whole
            else int(torch.randint(1, hi + 1, (1,), generator=g))
        )

    seen = [0, 0, 0]
    for i in range(32):
        whole, aligned = i % 4 != 3, i % 8 < 6
        store = torch.full((3, 24, 40), float("nan"), device=DEVICE)  # [slots, ., .]
        other = torch.full((3, 16, 48), float("nan"), device=DEVICE)
        dst, steps = [], []
        for buf in (store, other):
            r, c = pick(buf.shape[1], whole), pick(buf.shape[1], whole)
            transposed = bool(torch.randint(0, 2, (1,), generator=g))
            dst.append(buf[0, :c, :r].t() if transposed else buf[0, :r, :c])
            steps.append(buf.stride(0))
        cube = torch.full((3, 6, 4, 40), float("nan"), device=DEVICE)
        merge = torch.full((3, 6, 4, 40), float("nan"), device=DEVICE)
        dst.append(cube[0, :, :, :16])  # 3-D, rows of 16 of 40: one block per leading index
        dst.append(merge[0])  # 3-D whose leading dims merge
        steps += [cube.stride(0), merge.stride(0)]
        bufs = (store, other, cube, merge)
        total = sum(d.numel() + 8 for d in dst)
        src_base = torch.randn(total + 16, generator=g).to(DEVICE)
        src, off = [], 0 if aligned else int(torch.randint(1, 8, (1,), generator=g))
        for d in dst:
            src.append(src_base[off : off + d.numel()].view(d.shape))
            off += -(-d.numel() // 8) * 8 if aligned else d.numel() + int(torch.randint(0, 8, (1,), generator=g))
        plan = scatter_plan(dst, src, src_base, store, steps)
        assert _hints_hold(plan)
        seen = [n + int(t.shape[0]) for n, t in zip(seen, (plan.flat, plan.transposed, plan.strided))]
        shift = int(torch.randint(0, 3, (1,), generator=g))
        want = [b.clone() for b in bufs]
        for d, x, w, b in zip(dst, src, want, bufs):
            w.as_strided(d.shape, d.stride(), d.storage_offset() + shift * b.stride(0)).copy_(x)
        scatter_blocks(src_base, store, plan, shift=shift)
        assert all(_same(b, w) for b, w in zip(bufs, want))
    assert min(seen) > 0  # every table was exercised


def test_empty_pairs_are_skipped():
    store = torch.zeros(4, 3, 16, device=DEVICE)
    src_base = torch.zeros(8, device=DEVICE)
    plan = scatter_plan([store[:, :, :0]], [src_base[:0].view(4, 3, 0)], src_base, store)
    assert plan.rows == 0


def test_noop_plan_copies_nothing():
    a = torch.full((4, 8), 3.0, device=DEVICE)
    plan = ScatterPlan.noop(a.device)
    assert plan.rows == 3
    scatter_blocks(torch.zeros(8, device=DEVICE), a, plan)
    assert bool((a == 3.0).all())


def test_plan_rejects_mismatched_pairs():
    dst, src, src_base, bufs = _case(torch.float32, 9, True)
    with pytest.raises(ValueError):
        scatter_plan([dst[0]], [src[1]], src_base, bufs[0])


@pytest.mark.parametrize("slot", [0, 2])
@pytest.mark.parametrize("rank", [9, 16])
def test_one_plan_serves_every_slot(slot, rank):
    """A plan built on slot 0's views with each tensor's slot stride as its step, launched with shift=slot, writes
    exactly slot `slot` (what the slot writer caches once per layout, whatever the pool's size)."""
    dst, src, src_base, (a, b_store, small) = _case(torch.float32, rank, True)
    b = b_store.transpose(1, 2)
    zero = [a[0, :, :rank], b[0, :, :rank]]
    plan = scatter_plan(zero, src[:2], src_base, a, steps=[a.stride(0), b.stride(0)])
    want_a, want_b = a.clone(), b_store.clone()
    scatter_reference([want_a[slot, :, :rank], want_b.transpose(1, 2)[slot, :, :rank]], src[:2])
    scatter_blocks(src_base, a, plan, shift=slot)
    for got, exp in ((a, want_a), (b_store, want_b)):
        assert _same(got, exp)
    with pytest.raises(ValueError):
        scatter_plan(zero, src[:2], src_base, a, steps=[1])
