"""Per-step LoRA metadata: built once per step, shared by every LoRA layer of the model."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class LoraMeta:
    """Tokens grouped by adapter slot.

    token_slot: [T] int32   slot of each token, -1 = base only
    sorted_idx: [T] int32   token indices stable-sorted by slot (base tokens last)
    seg_start:  [S+1] int32 segment boundaries into sorted_idx (adapted tokens only)
    seg_slot:   [S] int32   slot of each segment
    segments:   host copy [(slot, start, end)], for the CPU path (no device sync needed there)
    """

    token_slot: torch.Tensor
    sorted_idx: torch.Tensor
    seg_start: torch.Tensor
    seg_slot: torch.Tensor
    segments: list[tuple[int, int, int]]

    @property
    def num_tokens(self) -> int:
        return self.token_slot.shape[0]

    @property
    def any_lora(self) -> bool:
        return bool(self.segments)


def build_lora_meta(token_slot: list[int] | torch.Tensor, device: torch.device | str = "cpu") -> LoraMeta:
    """Group tokens by slot. `token_slot` is host data (the scheduler knows it), so no device sync."""
    slots = token_slot.tolist() if isinstance(token_slot, torch.Tensor) else list(token_slot)
    big = 1 << 30
    order = sorted(range(len(slots)), key=lambda t: (slots[t] if slots[t] >= 0 else big, t))
    segments: list[tuple[int, int, int]] = []
    for pos, t in enumerate(order):
        s = slots[t]
        if s < 0:
            break
        if segments and segments[-1][0] == s:
            segments[-1] = (s, segments[-1][1], pos + 1)
        else:
            segments.append((s, pos, pos + 1))
    starts = [seg[1] for seg in segments] + ([segments[-1][2]] if segments else [0])
    mk = lambda v: torch.tensor(v, dtype=torch.int32).to(device, non_blocking=True)  # noqa: E731
    return LoraMeta(
        token_slot=mk(slots),
        sorted_idx=mk(order),
        seg_start=mk(starts),
        seg_slot=mk([seg[0] for seg in segments]),
        segments=segments,
    )
