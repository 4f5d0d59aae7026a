"""`kernels/fused_moe.py` equals `kernels/moe_reference.py` (under TRITON_INTERPRET=1 on CPU: fp32 and fp16, the
interpreter's bf16 tl.dot is garbage), over routing patterns, T=1, base-only and mixed adapter slots with ranks
differing per slot (one empty), by both LoRA paths (per-adapter dot epilogues in the base GEMMs, and grouped
launches) and adapter popularity patterns; the alignment metadata holds every pair once; a row's result is its own."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.kernels.fused_moe import fused_moe
from multilora_cli.kernels.moe_align import align_pairs, num_blocks
from multilora_cli.kernels.moe_reference import moe_reference
from tests.devices import needs_interpreter
from tests.kernels.moe_cases import expert_lora, routing

# CPU tensors throughout: the interpreter only (on a GPU host, tests/kernels/test_fused_moe_gpu.py runs the kernels)
pytestmark = needs_interpreter

H, INTER, E, K, L, R = 32, 48, 6, 2, 4, 8  # INTER < BN and H < BK: masked tiles
RANKS = (8, 3, 0, 5)  # slot 2 stays empty (rank 0)
# the ways to run the LoRA terms: per-adapter dots in the base GEMMs' epilogues (16-row blocks: the shrink by a
# block's distinct adapters; 64-row blocks, prefill-sized: by (expert, adapter) group), grouped launches
PATHS = {
    "rows": dict(row_lora=True),
    "rows64": dict(row_lora=True, block_m=64),
    "grouped": dict(row_lora=False),
}


def _inputs(T, pattern, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    gate_up = (torch.randn(E, 2 * INTER, H, generator=g) * 0.2).to(dtype)
    down = (torch.randn(E, H, INTER, generator=g) * 0.2).to(dtype)
    weights, experts = routing(pattern, T, E, K, g)
    slot = torch.randint(-1, L, (T,), generator=g)
    lora = expert_lora(L, R, E, H, INTER, RANKS, g, dtype, "cpu", amp=0.3)
    return x, weights, experts, gate_up, down, slot, lora


def _close(got, want, tol):
    """fp32: elementwise; fp16 rounds act and the shrinks on the way: within tol of the output's scale."""
    torch.testing.assert_close(got.float(), want, atol=tol * max(1.0, float(want.abs().amax())), rtol=tol)


def _reference(x, weights, experts, gate_up, down, slot, lora):
    """The oracle in fp32 on the same (rounded) inputs."""
    f = lambda t: t.float()  # noqa: E731
    lf = None
    if lora is not None:
        lf = type(lora)(
            *(f(getattr(lora, n)) if n not in ("rank", "shared") else getattr(lora, n) for n in lora.__slots__)
        )
    return moe_reference(f(x), weights, experts, f(gate_up), f(down), slot, lf)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 1e-2)])
@pytest.mark.parametrize("pattern", ["one", "uniform", "sparse"])
@pytest.mark.parametrize("T", [1, 7, 20])
@pytest.mark.parametrize("path", PATHS)
def test_fused_equals_reference_with_mixed_slots(dtype, tol, pattern, T, path):
    x, weights, experts, gate_up, down, slot, lora = _inputs(T, pattern, dtype)
    got = fused_moe(x, weights, experts, gate_up, down, slot, lora, **PATHS[path])
    want = _reference(x, weights, experts, gate_up, down, slot, lora)
    assert got.dtype == dtype
    _close(got, want, tol)
    base = _reference(x, weights, experts, gate_up, down, None, None)
    adapted = (slot >= 0) & (slot != 2)  # slot 2 is empty: its rows are the base's
    if adapted.any():  # the LoRA really changed the adapted rows (the test can fail)
        assert (want[adapted] - base[adapted]).abs().amax() > 20 * tol


def _popular(kind: str, T: int, g: torch.Generator) -> torch.Tensor:
    """Slots by adapter popularity: one adapter for every row, every row a different slot (no base rows), or
    mostly base rows with a few adapted ones."""
    if kind == "one":
        return torch.zeros(T, dtype=torch.int64)
    if kind == "distinct":
        return torch.tensor([0, 1, 3] * T)[:T]  # the non-empty slots, round-robin
    slot = torch.full((T,), -1, dtype=torch.int64)
    slot[torch.randperm(T, generator=g)[: max(1, T // 5)]] = 3
    return slot


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 1e-2)])
@pytest.mark.parametrize("popularity", ["one", "distinct", "base_heavy"])
@pytest.mark.parametrize("path", PATHS)
def test_fused_by_adapter_popularity(dtype, tol, popularity, path):
    x, weights, experts, gate_up, down, _, lora = _inputs(20, "uniform", dtype, seed=11)
    slot = _popular(popularity, 20, torch.Generator().manual_seed(12))
    got = fused_moe(x, weights, experts, gate_up, down, slot, lora, **PATHS[path])
    want = _reference(x, weights, experts, gate_up, down, slot, lora)
    _close(got, want, tol)
    base = _reference(x, weights, experts, gate_up, down, None, None)
    adapted = slot >= 0
    assert (want[adapted] - base[adapted]).abs().amax() > 20 * tol
    if popularity == "base_heavy":  # the base rows are the base's
        _close(got[~adapted], base[~adapted], tol)


def test_the_lora_paths_agree_in_fp32():
    """The dot epilogues (both shrinks) and the grouped launches: one computation, summed in other orders."""
    x, weights, experts, gate_up, down, slot, lora = _inputs(20, "uniform", torch.float32, seed=13)
    a, *others = (fused_moe(x, weights, experts, gate_up, down, slot, lora, **kw) for kw in PATHS.values())
    for b in others:
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 1e-2)])
@pytest.mark.parametrize("path", PATHS)
def test_several_output_tiles_and_k_steps(dtype, tol, path):
    """INTER and H past BN and BK (the shapes above fit one tile): the row path's down shrink is summed from the
    partials of 3 gate_up output tiles (the last one masked), and every GEMM loops over 2-3 K steps."""
    g = torch.Generator().manual_seed(21)
    h, inter, rank = 80, 144, 16
    x = torch.randn(9, h, generator=g).to(dtype)
    gate_up = (torch.randn(E, 2 * inter, h, generator=g) * 0.1).to(dtype)
    down = (torch.randn(E, h, inter, generator=g) * 0.1).to(dtype)
    weights, experts = routing("uniform", 9, E, K, g)
    slot = torch.tensor([0, 1, 3, -1, 0, 3, 1, 0, 3])
    lora = expert_lora(L, rank, E, h, inter, (16, 5, 0, 11), g, dtype, "cpu", amp=0.3)
    got = fused_moe(x, weights, experts, gate_up, down, slot, lora, **PATHS[path])
    _close(got, _reference(x, weights, experts, gate_up, down, slot, lora), tol)


def test_row_path_output_tiles_and_pdl_off_on_cpu():
    """The row path at other output tiles (the default is gate_up 64, down 128: fused_moe.LORA_BN) gives the same
    numbers in fp32 (down past one 128-wide tile, the last masked); PDL asked for on a CPU is off."""
    from multilora_cli.kernels.fused_moe import LORA_BN, row_pdl

    assert not row_pdl(torch.device("cpu"), 8, on=True).launch
    g = torch.Generator().manual_seed(23)
    h, inter = 200, 144
    x = torch.randn(11, h, generator=g)
    gate_up = torch.randn(E, 2 * inter, h, generator=g) * 0.1
    down = torch.randn(E, h, inter, generator=g) * 0.1
    weights, experts = routing("uniform", 11, E, K, g)
    slot = torch.tensor([0, 1, 3, -1, 0, 3, 1, 0, 3, 2, -1])
    lora = expert_lora(L, 16, E, h, inter, (16, 5, 0, 11), g, torch.float32, "cpu", amp=0.3)
    want = _reference(x, weights, experts, gate_up, down, slot, lora)
    for bn in {LORA_BN, (64, 64), (128, 128)}:
        got = fused_moe(x, weights, experts, gate_up, down, slot, lora, row_lora=True, pdl=True, lora_bn=bn)
        _close(got, want, 1e-4)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float16, 1e-2)])
def test_fused_base_only(dtype, tol):
    x, weights, experts, gate_up, down, _, _ = _inputs(9, "uniform", dtype, seed=3)
    got = fused_moe(x, weights, experts, gate_up, down)
    _close(got, _reference(x, weights, experts, gate_up, down, None, None), tol)


@pytest.mark.parametrize("path", PATHS)
def test_fused_qwen_weights_in_model_dtype_and_block_64(path):
    """Qwen's routing weights come in the model's dtype; a 64-row block (the prefill size) covers the same."""
    x, weights, experts, gate_up, down, slot, lora = _inputs(12, "uniform", torch.float16, seed=4)
    w16 = weights.to(torch.float16)
    got = fused_moe(x, w16, experts, gate_up, down, slot, lora, **{**PATHS[path], "block_m": 64})
    want = _reference(x, w16.float(), experts, gate_up, down, slot, lora)
    _close(got, want, 2e-2)


@pytest.mark.parametrize("path", PATHS)
def test_a_row_is_its_own(path):
    """Batch invariance: each row computed with 19 neighbours equals that row computed alone, bit for bit."""
    x, weights, experts, gate_up, down, slot, lora = _inputs(20, "uniform", torch.float32, seed=5)
    full = fused_moe(x, weights, experts, gate_up, down, slot, lora, **PATHS[path])
    for t in (0, 7, 19):
        one = (x[t : t + 1], weights[t : t + 1], experts[t : t + 1], gate_up, down, slot[t : t + 1], lora)
        alone = fused_moe(*one, **PATHS[path])
        assert torch.equal(alone[0], full[t])


@pytest.mark.parametrize("path", PATHS)
def test_eviction_gives_the_base_rows_back(path):
    x, weights, experts, gate_up, down, _, lora = _inputs(6, "uniform", torch.float32, seed=6)
    slot = torch.zeros(6, dtype=torch.int64)
    lora.clear_slot(0)
    got = fused_moe(x, weights, experts, gate_up, down, slot, lora, **PATHS[path])
    torch.testing.assert_close(got, fused_moe(x, weights, experts, gate_up, down), atol=0, rtol=0)


@pytest.mark.parametrize("bm", [16, 64])
def test_align_holds_every_pair_once_one_group_per_block(bm):
    g = torch.Generator().manual_seed(7)
    T = 37
    weights, experts = routing("uniform", T, E, K, g)
    slot = torch.randint(-1, L, (T,), generator=g)
    al = align_pairs(experts, slot, E, L, bm)
    nb = num_blocks(T * K, E * (L + 1), bm)
    assert al.sorted_pair.shape == (nb * bm,) and al.block_expert.shape == (nb,)
    pairs = al.sorted_pair[al.sorted_pair >= 0]
    assert torch.equal(pairs.sort().values, torch.arange(T * K, dtype=torch.int32))
    for b in range(nb):
        rows = al.sorted_pair[b * bm : (b + 1) * bm]
        rows = rows[rows >= 0].long()
        if al.block_expert[b] < 0:
            assert rows.numel() == 0
            continue
        assert rows.numel() > 0
        assert (experts.reshape(-1)[rows] == al.block_expert[b]).all()
        assert (slot[rows // K] == al.block_slot[b]).all()
    real = al.block_expert >= 0  # groups in ascending (expert, slot) order, then only padding blocks
    group = (al.block_expert * (L + 1) + al.block_slot + 1)[real]
    assert torch.equal(group, group.sort().values) and not real[int(real.sum()) :].any()
    key = experts.reshape(-1) * (L + 1) + slot.repeat_interleave(K) + 1
    assert int(real.sum()) == int(((torch.bincount(key, minlength=E * (L + 1)) + bm - 1) // bm).sum())


@pytest.mark.parametrize("bm, pattern", [(16, "uniform"), (64, "uniform"), (16, "sparse")])
def test_align_by_expert_in_slot_order(bm, pattern):
    """by_expert: each block one expert, an expert's rows in one run padded once, in slot order (base rows first)."""
    g = torch.Generator().manual_seed(11)
    T = 41
    _, experts = routing(pattern, T, E, K, g)
    slot = torch.randint(-1, L, (T,), generator=g)
    al = align_pairs(experts, slot, E, L, bm, by_expert=True)
    nb = num_blocks(T * K, E, bm)
    assert al.sorted_pair.shape == (nb * bm,) and (al.block_slot == -1).all()
    pairs = al.sorted_pair[al.sorted_pair >= 0]
    assert torch.equal(pairs.sort().values, torch.arange(T * K, dtype=torch.int32))
    flat = experts.reshape(-1)
    real = al.block_expert >= 0
    assert torch.equal(al.block_expert[real], al.block_expert[real].sort().values) and not real[int(real.sum()) :].any()
    assert int(real.sum()) == sum(-(-int((flat == e).sum()) // bm) for e in range(E))  # padding once per expert
    for e in al.block_expert[real].unique().tolist():
        run = al.sorted_pair.view(nb, bm)[al.block_expert == e].reshape(-1)
        n = int((flat == e).sum())
        assert (run[:n] >= 0).all() and (run[n:] == -1).all()  # the expert's pairs, then its padding
        rows = run[:n].long()
        assert (flat[rows] == e).all()
        assert torch.equal(slot[rows // K], slot[rows // K].sort().values)  # slot order
    key = flat.long() * (L + 1) + slot.repeat_interleave(K) + 1  # each (expert, slot) group: one contiguous run
    assert torch.equal(al.group_count.long(), torch.bincount(key, minlength=E * (L + 1)))
    for grp in key.unique().tolist():
        run = al.sorted_pair[int(al.group_end[grp] - al.group_count[grp]) : int(al.group_end[grp])].long()
        assert torch.equal(run.sort().values, (key == grp).nonzero().view(-1))


def test_align_by_expert_alone():
    g = torch.Generator().manual_seed(8)
    _, experts = routing("sparse", 30, E, K, g)
    al = align_pairs(experts, None, E, 0, 16)
    assert (al.block_slot[al.block_expert >= 0] == -1).all()
    for b in range(al.num_blocks):
        rows = al.sorted_pair[b * 16 : (b + 1) * 16]
        rows = rows[rows >= 0].long()
        assert (experts.reshape(-1)[rows] == al.block_expert[b]).all()
    assert int((al.block_expert >= 0).sum()) == sum(-(-int((experts == e).sum()) // 16) for e in range(E))


@pytest.mark.parametrize("path, aligns, shrinks, expands, sums", [("rows", 1, 1, 0, 1), ("grouped", 2, 2, 2, 0)])
def test_dry_run_records_every_launch(path, aligns, shrinks, expands, sums):
    """engine/precompile.py dry-runs forwards under launch.collect(): every kernel of the call is recorded (so it is
    compiled before the first step), and the torch ops around them need no kernel output."""
    from multilora_cli.kernels.launch import collect

    x, weights, experts, gate_up, down, slot, lora = _inputs(5, "uniform", torch.float32, seed=9)
    with collect() as calls:
        fused_moe(x, weights, experts, gate_up, down, slot, lora, **PATHS[path])
    names = [c[0].fn.__name__ for c in calls]
    assert names.count("_count_kernel") == names.count("_place_kernel") == aligns  # by expert (, by (expert, slot))
    assert names.count("_expert_gemm_kernel") == 2 and names.count("_lora_expand_kernel") == expands
    assert names.count("_sum_parts_kernel") == sums  # the rows path's down shrink: its partials summed once
    assert names.count("_lora_shrink_kernel") == shrinks and len(names) == 3 * aligns + 2 + shrinks + expands + sums
