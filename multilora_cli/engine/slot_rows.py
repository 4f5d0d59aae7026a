"""`SlotRows`: every LoRA module's rank and scaling rows, stored so that one slot of all modules is one tensor view.

Each module's `LoraWeights.rank` / `.scale` is [max_loras, n_slices] (contiguous: the SGMV kernels index it as
slot * n_slices + slice). Here the modules with the same slice count k share ONE tensor [modules with k slices,
max_loras, k], and module j's rows are its [j] (still contiguous [max_loras, k]). Writing slot s of every module is
then one copy per distinct k into `R_k[:, s]` ([n_k, k], strided), instead of a foreach copy over one view per
module and slot: those views (2 x modules a slot, 128 for Llama-3.2-1B) were made at a slot's first load and kept,
~110k long-lived tensors at 1,000 slots, which grew the host time of a load with the pool and gave Python's GC
most of its work in the 1,000-adapter bench (236 generation-0 collections against 42 at 64 adapters; issue 38).

    groups: [(module indices, R [n_k, max_loras, k] int32, S [n_k, max_loras, k] float32)], k ascending
    rows:   per group, (ranks [n_k, k] int32, scales [n_k, k] float32) of one adapter, on the device
"""

from __future__ import annotations

import numpy as np
import torch


class SlotRows:
    """Rank / scaling rows of `modules` ([(key, LoRALinear)]), re-pointed into shared per-slice-count storage
    (call before CUDA graphs are captured: they bake in the rows' addresses)."""

    def __init__(self, modules: list):
        by_k: dict[int, list[int]] = {}
        for j, (_, m) in enumerate(modules):
            by_k.setdefault(m.lora.n_slices, []).append(j)
        self.groups: list[tuple[np.ndarray, torch.Tensor, torch.Tensor]] = []
        for k, idx in sorted(by_k.items()):
            w0 = modules[idx[0]][1].lora
            shape = (len(idx), w0.max_loras, k)
            ranks = torch.zeros(shape, dtype=torch.int32, device=w0.rank.device)
            scales = torch.zeros(shape, dtype=torch.float32, device=w0.scale.device)
            for g, j in enumerate(idx):
                w = modules[j][1].lora
                ranks[g].copy_(w.rank)
                scales[g].copy_(w.scale)
                w.rank, w.scale = ranks[g], scales[g]
            self.groups.append((np.asarray(idx), ranks, scales))

    def split(self, ranks: np.ndarray, scales: np.ndarray, to_device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One adapter's rows ([modules, width] host arrays, module order) as per-group device tensors;
        `to_device(host array) -> device tensor` (pinned and async on CUDA)."""
        out = []
        for idx, r, _ in self.groups:
            k = r.shape[2]
            out.append(
                (to_device(np.ascontiguousarray(ranks[idx, :k])), to_device(np.ascontiguousarray(scales[idx, :k])))
            )
        return out

    def write(self, slot: int, rows: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Slot `slot` of every module gets `rows` (`split`'s), one copy per group and kind."""
        for (_, r, s), (rr, ss) in zip(self.groups, rows):
            r[:, slot].copy_(rr, non_blocking=True)
            s[:, slot].copy_(ss, non_blocking=True)

    def clear(self, slot: int) -> None:
        """Rank 0 and scaling 0 in slot `slot` of every module."""
        for _, r, s in self.groups:
            r[:, slot].zero_()
            s[:, slot].zero_()
