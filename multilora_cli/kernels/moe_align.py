"""`align_pairs`: a MoE step's (token, k) pairs grouped by (expert, adapter slot) into block-aligned segments.

    experts: [T, K] int   chosen experts;  slot: [T] int (adapter slot, -1 = base) or None (group by expert)
    G = E * (L + 1) groups (L slots + base; E without slot), group g = expert * (L + 1) + slot + 1

    each group's pairs p = t * K + k take a run of rows padded to a multiple of BM, runs in group order:
    sorted_pair:  [NB * BM] int32   pair id at each row, -1 = padding
    block_expert: [NB] int32        expert of the rows b*BM .. b*BM+BM-1, -1 = past the last group (no work)
    block_slot:   [NB] int32        adapter slot of those rows (-1 = base)

by_expert=True (with a slot): the same groups, but an expert's groups share one padded run (padding only at the
end of each expert's rows): blocks are by expert alone (block_slot = -1: rows of many slots), their rows ordered
by slot. Why: a block's LoRA epilogue runs one dot per distinct slot in it (kernels/moe_dots.py), and the shrink
one program per (block, distinct slot), or at prefill sizes per group (its rows one run: group_end, group_count);
rows in slot order put each adapter's rows of an expert in as few blocks as possible (a prefill step's 64-row
block: a few adapters instead of one per row or two), while each expert's weights are still streamed once per
block of BM pairs.

NB = cdiv(T*K, BM) + min(T*K, G) (G = E with by_expert) is a static bound (each non-empty group adds at most one
partial block), so the shapes depend on T only and nothing waits for the host: the metadata (and everything
launched over it) can be captured in a CUDA graph. Three Triton launches after one memset (a torch version took
~35 small launches, which at 48 layers a decode step cost milliseconds): count per group (atomics), a scan of the
padded counts that maps blocks to runs, then place each pair at its group's cursor (atomics). The scan by group is
one program (a binary search per block); by expert it is one program per expert, each reading the per-expert
totals the count kernel also keeps. The one-program scan over an [experts, slots] tile it replaced took ~9 us a
layer of a decode step (2.7 for the base's scan by expert alone); H200, 256 tokens x 16 / 64 adapters, the row
path's layer went from 453 to 446 / 496 to 489 us, 1,083 tokens x 16 from 833 to 825 (benchmarks/HISTORY.md).
The order of pairs inside a group is whatever the atomics give: every kernel computes a row from that row's inputs
alone, so results do not depend on it.
Triton variants do not depend on T (tests/engine/test_precompile_sizes.py): the sizes that vary with it (P, G, NB)
are not specialised on (`do_not_specialize`), and each output starts on 16 bytes. Else the runner's dry-run prefill
sizes (powers of two) left NB % 16 = 8 and block_expert's offset % 16 = 4 at 64-row blocks to a compile inside the
run (a 1,083-token prefill step took 1.7 s, H200, Qwen3-30B-A3B bench).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from multilora_cli.kernels.launch import launch

BLOCK, CHUNK = 256, 1024


@dataclass(slots=True)
class MoeAlign:
    sorted_pair: torch.Tensor
    block_expert: torch.Tensor
    block_slot: torch.Tensor
    block_m: int
    group_end: torch.Tensor  # [G] int32: end row of each group's pairs (its rows: end - count .. end - 1)
    group_count: torch.Tensor  # [G] int32: pairs per group
    n_slot: int  # L + 1 (1 without a slot): group g = expert * n_slot + slot + 1

    @property
    def num_blocks(self) -> int:
        return self.block_expert.shape[0]


def _up4(n: int) -> int:
    """n rounded up to 4 int32s (16 bytes)."""
    return -(-n // 4) * 4


def num_blocks(num_pairs: int, groups: int, block_m: int) -> int:
    """Static upper bound on the blocks the padded segments take."""
    return -(-num_pairs // block_m) + min(num_pairs, groups)


@triton.jit
def _group_of(experts_ptr, slot_ptr, offs, ok, top_k, n_slot, HAS_SLOT: tl.constexpr):
    key = tl.load(experts_ptr + offs, mask=ok, other=0).to(tl.int32) * n_slot
    if HAS_SLOT:
        key += tl.load(slot_ptr + offs // top_k, mask=ok, other=-1).to(tl.int32) + 1
    return key


@triton.jit(do_not_specialize=["P", "G"])
def _count_kernel(
    experts_ptr, slot_ptr, counts_ptr, P, top_k, n_slot, G,
    HAS_SLOT: tl.constexpr, BLOCK: tl.constexpr, EXPERT_TOTALS: tl.constexpr,
):  # fmt: skip
    """counts[g] = pairs of group g; EXPERT_TOTALS: also counts[G + e] = pairs of expert e (the by-expert scan's)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < P
    key = _group_of(experts_ptr, slot_ptr, offs, ok, top_k, n_slot, HAS_SLOT)
    one = tl.full((BLOCK,), 1, tl.int32)
    tl.atomic_add(counts_ptr + key, one, mask=ok)
    if EXPERT_TOTALS:
        tl.atomic_add(counts_ptr + G + key // n_slot, one, mask=ok)


@triton.jit(do_not_specialize=["NB"])
def _scan_by_expert_kernel(
    counts_ptr, cursor_ptr, sorted_ptr, bexp_ptr, bslot_ptr, E, G, NB, n_slot,
    BM: tl.constexpr, EB: tl.constexpr, SB: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """One program per expert e (each expert's groups share one run, padded once): e's run starts after the
    padded runs of experts 0..e-1 (from the per-expert totals at counts[G:]); cursor[e, j] = its start + the pairs
    of its groups before j; its rows -1 (the place kernel fills the real ones), its blocks mapped to e. The last
    program marks the rows and blocks past every run. No program reads what another writes."""
    e = tl.program_id(0)
    ee = tl.arange(0, EB)
    padded = (tl.load(counts_ptr + G + ee, mask=ee < E, other=0) + BM - 1) // BM * BM
    start = tl.sum(tl.where(ee < e, padded, 0), 0)
    stop = start + tl.sum(tl.where(ee == e, padded, 0), 0)
    j = tl.arange(0, SB)
    cnt = tl.load(counts_ptr + e * n_slot + j, mask=j < n_slot, other=0)
    tl.store(cursor_ptr + e * n_slot + j, start + tl.cumsum(cnt, 0) - cnt, mask=j < n_slot)
    lo = start
    hi = stop
    if e == E - 1:  # past every run: padding rows and blocks to the static bound
        hi = NB * BM
    for i0 in range(lo, hi, CHUNK):
        i = i0 + tl.arange(0, CHUNK)
        tl.store(sorted_ptr + i, tl.full((CHUNK,), -1, tl.int32), mask=i < hi)
    for b0 in range(lo // BM, hi // BM, CHUNK):
        b = b0 + tl.arange(0, CHUNK)
        ok = b < hi // BM
        tl.store(bexp_ptr + b, tl.where(b < stop // BM, e, -1), mask=ok)
        tl.store(bslot_ptr + b, tl.full((CHUNK,), -1, tl.int32), mask=ok)


@triton.jit(do_not_specialize=["G", "NB"])
def _scan_kernel(
    counts_ptr, cursor_ptr, end_ptr, sorted_ptr, bexp_ptr, bslot_ptr, G, NB, n_slot, search_steps,
    BM: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """One program, over the G groups (each its own padded run): end[g] = end row of g's run; cursor[g] = its start
    row; sorted rows = -1; block b's group = the first with end[g] > b * BM (G = none)."""
    carry = tl.zeros((CHUNK,), dtype=tl.int32)
    for g0 in range(0, G, CHUNK):
        g = g0 + tl.arange(0, CHUNK)
        ok = g < G
        padded = (tl.load(counts_ptr + g, mask=ok, other=0) + BM - 1) // BM * BM
        end = tl.cumsum(padded, 0) + carry
        tl.store(end_ptr + g, end, mask=ok)
        tl.store(cursor_ptr + g, end - padded, mask=ok)
        carry += tl.sum(padded, 0)
    for i0 in range(0, NB * BM, CHUNK):
        i = i0 + tl.arange(0, CHUNK)
        tl.store(sorted_ptr + i, tl.full((CHUNK,), -1, tl.int32), mask=i < NB * BM)
    tl.debug_barrier()  # end[] written above is read below by other threads of this program
    for b0 in range(0, NB, CHUNK):
        b = b0 + tl.arange(0, CHUNK)
        lo = b * BM
        left = tl.zeros((CHUNK,), dtype=tl.int32)
        right = tl.full((CHUNK,), 0, tl.int32) + G
        for _ in range(search_steps):  # upper bound of lo in end[0..G): first group with end[g] > lo
            active = left < right
            mid = (left + right) // 2
            v = tl.load(end_ptr + mid, mask=active, other=0)
            up = v <= lo
            left = tl.where(active & up, mid + 1, left)
            right = tl.where(active & (v > lo), mid, right)
        found = left < G
        ok = b < NB
        tl.store(bexp_ptr + b, tl.where(found, left // n_slot, -1), mask=ok)
        tl.store(bslot_ptr + b, tl.where(found, left % n_slot - 1, -1), mask=ok)


@triton.jit(do_not_specialize=["P"])
def _place_kernel(
    experts_ptr, slot_ptr, cursor_ptr, sorted_ptr, P, top_k, n_slot, HAS_SLOT: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < P
    key = _group_of(experts_ptr, slot_ptr, offs, ok, top_k, n_slot, HAS_SLOT)
    row = tl.atomic_add(cursor_ptr + key, tl.full((BLOCK,), 1, tl.int32), mask=ok)
    tl.store(sorted_ptr + row, offs, mask=ok)


def align_pairs(
    experts: torch.Tensor,
    slot: torch.Tensor | None,
    num_experts: int,
    num_slots: int,
    block_m: int,
    by_expert: bool = False,
) -> MoeAlign:
    """See the module docstring. num_slots: L (adapter slots; ignored when slot is None); by_expert: blocks by
    expert, rows in slot order (needs slot)."""
    T, K = experts.shape
    P, dev = T * K, experts.device
    n_slot = num_slots + 1 if slot is not None else 1
    G = num_experts * n_slot
    nb = num_blocks(P, num_experts if by_expert else G, block_m)
    experts = experts.contiguous()
    slot_arg = slot.contiguous() if slot is not None else experts
    counts = torch.zeros(G + (num_experts if by_expert else 0), dtype=torch.int32, device=dev)
    # one allocation, each piece starting on 16 bytes: Triton specialises a pointer on its 16-byte alignment, and
    # offsets that moved with nb gave the kernels reading block_expert / block_slot a variant per nb % 4
    g4, nb4, rows = _up4(G), _up4(nb), nb * block_m
    ints = torch.empty(2 * g4 + rows + 2 * nb4, dtype=torch.int32, device=dev)
    cursor, end = ints[:G], ints[g4 : g4 + G]  # end: the group scan's search table (unused by expert)
    sorted_pair = ints[2 * g4 : 2 * g4 + rows]
    block_expert = ints[2 * g4 + rows : 2 * g4 + rows + nb]
    block_slot = ints[2 * g4 + rows + nb4 : 2 * g4 + rows + nb4 + nb]
    grid = (triton.cdiv(P, BLOCK),)
    has = slot is not None
    launch(
        _count_kernel, grid, experts, slot_arg, counts, P, K, n_slot, G, HAS_SLOT=has, BLOCK=BLOCK,
        EXPERT_TOTALS=by_expert,
    )  # fmt: skip
    if by_expert:
        launch(
            _scan_by_expert_kernel, (num_experts,), counts, cursor, sorted_pair, block_expert, block_slot,
            num_experts, G, nb, n_slot, BM=block_m, EB=triton.next_power_of_2(num_experts),
            SB=triton.next_power_of_2(n_slot), CHUNK=CHUNK,
        )  # fmt: skip
    else:
        launch(
            _scan_kernel, (1,), counts, cursor, end, sorted_pair, block_expert, block_slot, G, nb, n_slot,
            G.bit_length(), BM=block_m, CHUNK=CHUNK,
        )  # fmt: skip
    launch(_place_kernel, grid, experts, slot_arg, cursor, sorted_pair, P, K, n_slot, HAS_SLOT=has, BLOCK=BLOCK)
    return MoeAlign(sorted_pair, block_expert, block_slot, block_m, cursor, counts[:G], n_slot)
