"""One Llama-3-8B layer's LoRA work for the kernel benchmark: the modules' shapes, slot pools of random weights,
the bytes floor of a point, and a point's rotations (metadata, x and y per rotation) for ours and a torch loop.

A point is (tokens, adapters, rank); its tokens are spread round-robin over min(tokens, adapters) distinct
adapters, interleaved, so the kernels must gather. Rotations use different pool copies, slots, x and y, so one
rotation's bytes are not in L2 for the next.
"""

from __future__ import annotations

import math

import torch

from multilora_cli.kernels import LoraMetaBuffers, LoraWeights, add_lora

MODULES = {  # Llama-3-8B: name -> (in_features, packed output slices)
    "qkv": (4096, [4096, 1024, 1024]),
    "o": (4096, [4096]),
    "gate_up": (4096, [14336, 14336]),
    "down": (14336, [4096]),
}
DT = torch.bfloat16
DEVICE = "cuda"


class Pools:
    """n_copies of each module's slot pool (max_loras x pool_rank), random bf16 weights."""

    def __init__(self, copies: int, max_loras: int, pool_rank: int):
        self.max_loras, self.pool_rank = max_loras, pool_rank
        self.w = {name: [] for name in MODULES}
        for name, (in_f, slices) in MODULES.items():
            for _ in range(copies):
                w = LoraWeights.empty(max_loras, pool_rank, in_f, slices, DT, DEVICE)
                w.a.normal_(0, in_f**-0.5)
                w.b.normal_(0, 0.1)
                self.w[name].append(w)

    def set_rank(self, rank: int) -> None:
        for ws in self.w.values():
            for w in ws:
                w.rank.fill_(rank)
                w.scale.fill_(2.0)


def floor_bytes(t: int, distinct: int, rank: int) -> int:
    total = 0
    for in_f, slices in MODULES.values():
        out = sum(slices)
        total += distinct * rank * (len(slices) * in_f + out) * 2  # A and B of each distinct adapter, once
        total += t * in_f * 2 + t * out * 2 * 2  # x read, y read + written
    return total


class Case:
    """K rotations of one (tokens, adapters, rank) point: metadata buffers, slots, x and y per rotation."""

    def __init__(self, pools: Pools, t: int, adapters: int, rank: int, rotations: int):
        self.pools, self.t, self.rank = pools, t, rank
        self.distinct = min(t, adapters)
        copies = len(pools.w["qkv"])
        self.rot = []
        for k in range(rotations):
            base = (k // copies) * self.distinct
            slots = [(base + j) % pools.max_loras for j in range(self.distinct)]
            ts = [slots[i % self.distinct] for i in range(t)]  # interleaved: the kernels must gather
            bufs = LoraMetaBuffers(t, pools.max_loras, DEVICE)
            meta = bufs.build(ts)
            xs = {n: torch.randn(t, in_f, device=DEVICE, dtype=DT) for n, (in_f, _) in MODULES.items()}
            ys = {n: torch.randn(t, sum(sl), device=DEVICE, dtype=DT) for n, (_, sl) in MODULES.items()}
            idx = {s: torch.tensor([i for i in range(t) if ts[i] == s], device=DEVICE) for s in slots}
            self.rot.append(dict(copy=k % copies, bufs=bufs, meta=meta, x=xs, y=ys, idx=idx))

    def ours(self, k: int, modules=MODULES) -> None:
        r = self.rot[k]
        for n in modules:
            add_lora(r["y"][n], r["x"][n], self.pools.w[n][r["copy"]], r["meta"])

    def torch_loop(self, k: int) -> None:
        """The obvious per-adapter loop: gather rows, shrink and expand per slice, scatter-add."""
        r = self.rot[k]
        for n, (_, slices) in MODULES.items():
            w = self.pools.w[n][r["copy"]]
            x, y = r["x"][n], r["y"][n]
            for slot, idx in r["idx"].items():
                xs = x.index_select(0, idx)
                parts = []
                for i in range(len(slices)):
                    lo, hi = w.slice_offsets[i], w.slice_offsets[i + 1]
                    s = (xs @ w.a[slot, i, : self.rank].T) * 2.0
                    parts.append(s @ w.b[slot, lo:hi, : self.rank].T)
                y.index_add_(0, idx, torch.cat(parts, 1) if len(parts) > 1 else parts[0])


def rotations_for(nbytes: int, l2: int) -> int:
    return max(2, min(32, math.ceil(3 * l2 / max(nbytes, 1))))
