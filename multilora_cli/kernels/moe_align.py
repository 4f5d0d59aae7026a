"""`align_pairs`: a MoE step's (token, k) pairs sorted by (expert, adapter slot) into block-aligned segments.

    experts: [T, K] int   chosen experts;  slot: [T] int (adapter slot, -1 = base) or None (base only)
    G = E * (L + 1) groups (L slots + base; 1 per expert without slot), group g = expert * (L + 1) + slot + 1

    pairs p = t * K + k, stable-sorted by group; each group's run padded to a multiple of BM rows:
    sorted_pair:  [NB * BM] int32   pair id at each row, -1 = padding
    block_expert: [NB] int32        expert of the rows b*BM .. b*BM+BM-1, -1 = past the last group (no work)
    block_slot:   [NB] int32        adapter slot of those rows (-1 = base)

NB = cdiv(T*K, BM) + min(T*K, G) is a static bound (each non-empty group adds at most one partial block), so the
shapes depend on T only and the torch ops below never wait for the host: the metadata (and everything launched
over it) can be captured in a CUDA graph. Each block holds ONE (expert, slot): the fused kernels stream that
expert's weights and that adapter's expert LoRA once per block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class MoeAlign:
    sorted_pair: torch.Tensor
    block_expert: torch.Tensor
    block_slot: torch.Tensor
    block_m: int

    @property
    def num_blocks(self) -> int:
        return self.block_expert.shape[0]


def num_blocks(num_pairs: int, groups: int, block_m: int) -> int:
    """Static upper bound on the blocks the padded segments take."""
    return -(-num_pairs // block_m) + min(num_pairs, groups)


def align_pairs(
    experts: torch.Tensor, slot: torch.Tensor | None, num_experts: int, num_slots: int, block_m: int
) -> MoeAlign:
    """See the module docstring. num_slots: L (adapter slots; ignored when slot is None)."""
    T, K = experts.shape
    P, dev = T * K, experts.device
    n_slot = num_slots + 1 if slot is not None else 1
    G = num_experts * n_slot
    key = experts.reshape(-1).to(torch.int64) * n_slot  # [P]
    if slot is not None:
        key = key + (slot.to(torch.int64) + 1)[:, None].expand(T, K).reshape(-1)  # pair p's token is p // K
    counts = torch.zeros(G, dtype=torch.int64, device=dev).scatter_add_(0, key, torch.ones_like(key))  # [G]
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)  # [G] end row of each group's padded run
    pad_start = pad_end - padded
    run_start = torch.cumsum(counts, 0) - counts  # where each group starts among the sorted pairs
    order = torch.argsort(key, stable=True)  # [P] pair ids by group, in pair order within a group
    skey = key[order]
    dest = pad_start[skey] + torch.arange(P, device=dev) - run_start[skey]  # [P] padded row of each sorted pair
    nb = num_blocks(P, G, block_m)
    sorted_pair = torch.full((nb * block_m,), -1, dtype=torch.int32, device=dev)
    sorted_pair.scatter_(0, dest, order.to(torch.int32))
    lo = torch.arange(nb, device=dev, dtype=torch.int64) * block_m
    # right=True: an empty group's end equals the next start, so a block's first row lands in a non-empty group
    group = torch.searchsorted(pad_end, lo, right=True)  # [NB], G = past the last group
    valid = group < G
    group = group.clamp(max=G - 1)
    none = torch.full_like(group, -1)
    block_expert = torch.where(valid, group // n_slot, none).to(torch.int32)
    block_slot = torch.where(valid, group % n_slot - 1, none).to(torch.int32)
    return MoeAlign(sorted_pair, block_expert, block_slot, block_m)
