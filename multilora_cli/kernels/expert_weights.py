"""`ExpertLoraWeights`: the LoRA slots of one sparse MoE block's experts (every adapter slot x every expert).

    gu_a:     [L, E, 2R, H]   lora_A of gate (rows 0..R) and up (rows R..2R), zero past each slice's rank
    gu_b:     [L, E, 2I, R]   lora_B of gate (rows 0..I) and up (rows I..2I), each over its own rank columns: the
                              block-diagonal [2I, 2R] of the two slices stored without its zero blocks
    gu_scale: [L, 2R] float32 scaling of each rank column (alpha / r of its slice; 0 = not adapted)
    dn_a:     [L, E, R, I]    lora_A of down;  dn_b: [L, E, H, R];  dn_scale: [L, R] float32
    rank:     [L] int32       largest rank of the slot's parts (0 = empty): the fused kernels read no rank row past
                              it and skip an empty slot (moe_reference needs no ranks: the padding is zeros)
    shared:   [L] int32       1 where up's A rows and scales equal gate's (PEFT target_parameters on gate_up_proj:
                              one lora_A for both): the fused shrink reads gate's A once and writes both slices'
                              columns (moe_reference reads both copies: same numbers)
Unused rank rows hold zeros and scale 0, so one shrink / expand per (expert, slot) covers both gate_up slices and
any rank <= R exactly: h[:, :I] += sg[:, :R] @ gu_b[s, e, :I]^T, h[:, I:] += sg[:, R:] @ gu_b[s, e, I:]^T
(`gate_up_delta`). A slot's bytes: E * (2R * H + 2I * R + R * I + H * R) values (`slot_numel`; at Qwen3-30B-A3B
shapes, rank 16: 1.66 GB over 48 layers, where the block-diagonal [2I, 2R] took 1.96 GB).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class ExpertLoraWeights:
    gu_a: torch.Tensor
    gu_b: torch.Tensor
    gu_scale: torch.Tensor
    dn_a: torch.Tensor
    dn_b: torch.Tensor
    dn_scale: torch.Tensor
    rank: torch.Tensor
    shared: torch.Tensor

    @classmethod
    def empty(cls, max_loras: int, max_rank: int, num_experts: int, hidden: int, inter: int, dtype, device):
        L, E, R = max_loras, num_experts, max_rank

        def z(*shape, dt=dtype):
            return torch.zeros(*shape, dtype=dt, device=device)

        return cls(
            z(L, E, 2 * R, hidden),
            z(L, E, 2 * inter, R),
            z(L, 2 * R, dt=torch.float32),
            z(L, E, R, inter),
            z(L, E, hidden, R),
            z(L, R, dt=torch.float32),
            z(L, dt=torch.int32),
            z(L, dt=torch.int32),
        )

    @property
    def max_loras(self) -> int:
        return self.gu_a.shape[0]

    @property
    def max_rank(self) -> int:
        return self.dn_a.shape[2]

    @staticmethod
    def slot_numel(max_rank: int, num_experts: int, hidden: int, inter: int) -> int:
        """Values one slot holds in one MoE block."""
        r = max_rank
        return num_experts * (2 * r * hidden + 2 * inter * r + r * inter + hidden * r)

    def clear_slot(self, slot: int) -> None:
        for t in (self.gu_a, self.gu_b, self.gu_scale, self.dn_a, self.dn_b, self.dn_scale, self.rank, self.shared):
            t[slot].zero_()

    def set_slot(self, slot: int, parts: dict[str, tuple[torch.Tensor, torch.Tensor, float]]) -> None:
        """parts: {"gate" | "up" | "down": (A [E, r, in], B [E, out, r], scaling)}; a missing part is not adapted."""
        self.clear_slot(slot)
        R, inter = self.max_rank, self.dn_a.shape[3]
        for name, (a, b, scaling) in parts.items():
            r = a.shape[1]
            if r > R:
                raise ValueError(f"expert LoRA {name}: rank {r} > max rank {R}")
            if name == "down":
                self.dn_a[slot, :, :r] = a
                self.dn_b[slot, :, :, :r] = b
                self.dn_scale[slot, :r] = scaling
                continue
            col = 0 if name == "gate" else R
            rows = slice(0, inter) if name == "gate" else slice(inter, 2 * inter)
            self.gu_a[slot, :, col : col + r] = a
            self.gu_b[slot, :, rows, :r] = b
            self.gu_scale[slot, col : col + r] = scaling
        self.rank[slot] = max((a.shape[1] for a, _, _ in parts.values()), default=0)
        gate, up = parts.get("gate"), parts.get("up")
        if gate is not None and up is not None and gate[2] == up[2] and gate[0].shape == up[0].shape:
            self.shared[slot] = int(torch.equal(gate[0], up[0]))


def gate_up_delta(sg: torch.Tensor, gu_b: torch.Tensor) -> torch.Tensor:
    """The gate_up expand of one (expert, slot): sg [n, 2R] (gate ranks | up ranks) and gu_b [2I, R] (gate rows |
    up rows) -> [n, 2I] = [sg[:, :R] @ gu_b[:I]^T | sg[:, R:] @ gu_b[I:]^T]."""
    R, inter = gu_b.shape[1], gu_b.shape[0] // 2
    return torch.cat([sg[:, :R] @ gu_b[:inter].T, sg[:, R:] @ gu_b[inter:].T], dim=1)
