"""Shared builders for kernel tests: poisoned slot pools, adapter-popularity patterns, error measures."""

from __future__ import annotations

import random

import torch

from multilora_cli.kernels import LoraWeights

# Slots in use are deliberately not contiguous; unused slots stay NaN (a read of them poisons the result).
SLOT_RANKS = {1: 8, 3: 16, 4: 64, 6: 1, 9: 16, 10: 64}
MAX_LORAS, MAX_RANK = 12, 64
POPULARITY = ("distinct", "uniform", "zipf", "identical", "skewed", "all-base", "one-token")


def make_pool(
    in_f: int,
    slices: list[int],
    dtype: torch.dtype,
    device="cpu",
    slot_ranks=None,
    seed: int = 0,
    max_loras: int = MAX_LORAS,
    max_rank: int = MAX_RANK,
) -> LoraWeights:
    """A slot pool with NaN everywhere no real weight lives: past each rank, unused slots, unadapted slices.

    Slot 3 leaves its second slice unadapted and slot 9 uses a smaller rank on its last slice (per-slice ranks).
    """
    g = torch.Generator().manual_seed(seed)
    w = LoraWeights.empty(max_loras, max_rank, in_f, slices, dtype, device)
    w.a.fill_(float("nan"))
    w.b.fill_(float("nan"))
    for slot, r in (slot_ranks or SLOT_RANKS).items():
        items = []
        for i, n in enumerate(slices):
            ri = max(1, r // 2) if (slot == 9 and i == len(slices) - 1) else r
            a = torch.randn(ri, in_f, generator=g) / in_f**0.5
            b = torch.randn(n, ri, generator=g) / ri**0.5
            items.append((a.to(dtype).to(device), b.to(dtype).to(device), 0.5 + 0.25 * i + 0.1 * slot))
        if slot == 3 and len(slices) > 1:
            items[1] = None
        w.set_slot(slot, items)
    return w


def token_slots(pattern: str, t: int, seed: int = 0, slots=None) -> list[int]:
    """Slot per token (-1 = base) for an adapter-popularity pattern."""
    rng = random.Random(seed)
    used = sorted(slots or SLOT_RANKS)
    if pattern == "one-token":
        return [used[-1]] + [-1] * (t - 1)
    if pattern == "all-base":
        return [-1] * t
    if pattern == "identical":
        return [used[2]] * t
    if pattern == "distinct":  # as many adapters as possible, each token a different one from its neighbours
        return [used[i % len(used)] for i in range(t)]
    if pattern == "uniform":
        return [rng.choice(used + [-1]) for _ in range(t)]
    if pattern == "zipf":
        weights = [1.0 / (k + 1) ** 1.2 for k in range(len(used) + 1)]
        return [rng.choices(used + [-1], weights=weights)[0] for _ in range(t)]
    if pattern == "skewed":  # one hot adapter, a long tail and some base rows
        return [used[0] if rng.random() < 0.85 else rng.choice(used[1:] + [-1]) for _ in range(t)]
    raise ValueError(pattern)


def assert_matches(
    out: torch.Tensor, y0: torch.Tensor, ref: torch.Tensor, token_slot: list[int], w: LoraWeights, tol: float
) -> None:
    """out vs float64 ref: every adapted element within tol of the delta's scale; untouched elements
    (base rows, rank-0 slices) bit-identical to y0."""
    assert not torch.isnan(out).any(), "NaN leaked: a kernel read memory past a rank or an unused slot"
    scale = (ref - y0.double()).abs().max().item() or 1.0
    err = (out.double() - ref).abs()
    assert err.max().item() <= tol * scale + tol * 1e-3, f"max err {err.max().item():.3e} vs delta scale {scale:.3e}"
    for t, s in enumerate(token_slot):
        for i in range(w.n_slices):
            lo, hi = w.slice_offsets[i], w.slice_offsets[i + 1]
            if s < 0 or int(w.rank[s, i]) == 0:
                assert torch.equal(out[t, lo:hi], y0[t, lo:hi]), f"token {t} slice {i} (slot {s}) was written"
