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
~35 small launches, which at 48 layers a decode step cost milliseconds): count per group (atomics), one program
scanning the padded counts and mapping blocks to groups (binary search), then place each pair at its group's
cursor (atomics). The order of pairs inside a group is whatever the atomics give: every kernel computes a row from
that row's inputs alone, so results do not depend on it.
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
# the one-program scan by expert walks an [experts, slots] tile: 8 warps instead of 4 took the row path's alignment
# from 21.2 to 17.1 us at 256 tokens x 35 slots, 28.2 to 21.3 at 64 slots (H200; 16 and 32 warps no better)
SCAN_WARPS = 8


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


@triton.jit(do_not_specialize=["P"])
def _count_kernel(experts_ptr, slot_ptr, counts_ptr, P, top_k, n_slot, HAS_SLOT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < P
    key = _group_of(experts_ptr, slot_ptr, offs, ok, top_k, n_slot, HAS_SLOT)
    tl.atomic_add(counts_ptr + key, tl.full((BLOCK,), 1, tl.int32), mask=ok)


@triton.jit(do_not_specialize=["G", "NB"])
def _scan_kernel(
    counts_ptr, cursor_ptr, end_ptr, sorted_ptr, bexp_ptr, bslot_ptr, G, NB, n_slot, search_steps,
    BM: tl.constexpr, CHUNK: tl.constexpr, BY_EXPERT: tl.constexpr, EC: tl.constexpr, SB: tl.constexpr,
):  # fmt: skip
    """One program. Runs: the G groups, or with BY_EXPERT the G experts (each holding its n_slot groups in one run
    padded once). end[run] = end row of its padded run; cursor[g] = start row of group g (BY_EXPERT: its expert's
    run start + the pairs of the expert's earlier groups); sorted rows = -1; block b's run = the first with
    end[run] > b * BM (G = none)."""
    if BY_EXPERT:
        j = tl.arange(0, SB)
        carry = tl.zeros((EC,), dtype=tl.int32)
        for e0 in range(0, G, EC):
            e = e0 + tl.arange(0, EC)
            cells = (e < G)[:, None] & (j < n_slot)[None, :]
            cnt = tl.load(counts_ptr + e[:, None] * n_slot + j[None, :], mask=cells, other=0)  # [EC, SB]
            padded = (tl.sum(cnt, 1) + BM - 1) // BM * BM
            end = tl.cumsum(padded, 0) + carry
            tl.store(end_ptr + e, end, mask=e < G)
            before = tl.cumsum(cnt, 1) - cnt  # pairs of the expert's earlier groups
            tl.store(cursor_ptr + e[:, None] * n_slot + j[None, :], (end - padded)[:, None] + before, mask=cells)
            carry += tl.sum(padded, 0)
    else:
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
        for _ in range(search_steps):  # upper bound of lo in end[0..G): first run with end[run] > lo
            active = left < right
            mid = (left + right) // 2
            v = tl.load(end_ptr + mid, mask=active, other=0)
            up = v <= lo
            left = tl.where(active & up, mid + 1, left)
            right = tl.where(active & (v > lo), mid, right)
        found = left < G
        ok = b < NB
        if BY_EXPERT:
            tl.store(bexp_ptr + b, tl.where(found, left, -1), mask=ok)
            tl.store(bslot_ptr + b, tl.full((CHUNK,), -1, tl.int32), mask=ok)
        else:
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
    counts = torch.zeros(G, dtype=torch.int32, device=dev)
    # one allocation, each piece starting on 16 bytes: Triton specialises a pointer on its 16-byte alignment, and
    # offsets that moved with nb gave the kernels reading block_expert / block_slot a variant per nb % 4
    g4, nb4, rows = _up4(G), _up4(nb), nb * block_m
    ints = torch.empty(2 * g4 + rows + 2 * nb4, dtype=torch.int32, device=dev)
    cursor, end = ints[:G], ints[g4 : g4 + G]
    sorted_pair = ints[2 * g4 : 2 * g4 + rows]
    block_expert = ints[2 * g4 + rows : 2 * g4 + rows + nb]
    block_slot = ints[2 * g4 + rows + nb4 : 2 * g4 + rows + nb4 + nb]
    grid = (triton.cdiv(P, BLOCK),)
    has = slot is not None
    launch(_count_kernel, grid, experts, slot_arg, counts, P, K, n_slot, HAS_SLOT=has, BLOCK=BLOCK)
    runs = num_experts if by_expert else G
    sb = triton.next_power_of_2(n_slot) if by_expert else 1  # (unused by the group scan: one compiled variant)
    launch(
        _scan_kernel, (1,), counts, cursor, end, sorted_pair, block_expert, block_slot, runs, nb, n_slot,
        runs.bit_length(), BM=block_m, CHUNK=CHUNK, BY_EXPERT=by_expert, EC=max(1, 8192 // sb), SB=sb,
        num_warps=SCAN_WARPS if by_expert else 4,
    )  # fmt: skip
    launch(_place_kernel, grid, experts, slot_arg, cursor, sorted_pair, P, K, n_slot, HAS_SLOT=has, BLOCK=BLOCK)
    return MoeAlign(sorted_pair, block_expert, block_slot, block_m, cursor, counts, n_slot)
