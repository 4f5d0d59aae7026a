"""MoE expert LoRA in a packed adapter's flat buffer (engine/packed.py): where each (layer, part) sits, its tensors
as views of the buffer, and the sources `pack_adapter` copies in.

Per (layer, part), in layer then gate, up, down order, each tensor as the checkpoint stores it (so a direct read
is a few large file spans, and no layout change runs on the host: the slot scatter does them on the device,
engine/expert_slots.py):
    A [E, r, in]      both layouts (PEFT target_parameters: lora_A [E * r, in]); gate and up of a PEFT
                      gate_up_proj share one A (`shares_a`: the up part points at the gate's)
    B [out, r, E]     PEFT target_parameters (`peft_b`: lora_B [out, r * E], gate rows then up rows back to back)
      [E, out, r]     per-expert modules (experts.{e}.w1 ...: lora_B [out, r] per expert; left-out experts: zeros)
Expert e's factors are then A[e] [r, in] and B[:, :, e] (peft_b) or B[e] [out, r].
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

PARTS = ("gate", "up", "down")


@dataclass(frozen=True, slots=True)
class ExpertPart:
    """One (layer, part) of expert LoRA in the flat buffer: A at element a_off, B at b_off (module docstring)."""

    layer: int
    part: str
    experts: int  # E
    rank: int
    in_features: int
    out_features: int
    a_off: int
    b_off: int
    peft_b: bool
    scaling: float = 0.0

    @property
    def a_numel(self) -> int:
        return self.experts * self.rank * self.in_features

    @property
    def b_numel(self) -> int:
        return self.experts * self.out_features * self.rank

    @property
    def shape_key(self) -> tuple:
        """Everything but the scaling: adapters that differ in alpha only share one layout (and scatter plan)."""
        return (
            self.layer,
            self.part,
            self.experts,
            self.rank,
            self.in_features,
            self.out_features,
            self.a_off,
            self.b_off,
            self.peft_b,
        )

    def a_view(self, flat: torch.Tensor) -> torch.Tensor:
        """A [E, r, in] of `flat` (the host buffer or its device copy)."""
        return flat[self.a_off : self.a_off + self.a_numel].view(self.experts, self.rank, self.in_features)

    def b_stored(self, flat: torch.Tensor) -> torch.Tensor:
        """B as stored: [out, r, E] (peft_b) or [E, out, r]."""
        b = flat[self.b_off : self.b_off + self.b_numel]
        if self.peft_b:
            return b.view(self.out_features, self.rank, self.experts)
        return b.view(self.experts, self.out_features, self.rank)

    def b_view(self, flat: torch.Tensor) -> torch.Tensor:
        """B [E, out, r] (a permuted view when peft_b)."""
        b = self.b_stored(flat)
        return b.permute(2, 0, 1) if self.peft_b else b


def plan_experts(
    experts: dict[tuple[int, str], tuple[int, int, int, int, float, bool, bool]], total: int
) -> tuple[tuple[ExpertPart, ...], int]:
    """Place (layer, part) -> (E, rank, in, out, scaling, peft_b, shares_a) from element `total` on; returns the
    parts in buffer order and the new total."""
    parts: list[ExpertPart] = []
    for layer, part in sorted(experts, key=lambda k: (k[0], PARTS.index(k[1]))):
        E, r, fin, fout, scaling, peft_b, shares_a = experts[(layer, part)]
        gate = parts[-1] if parts and (parts[-1].layer, parts[-1].part) == (layer, "gate") else None
        if shares_a and (part != "up" or gate is None or (gate.experts, gate.rank, gate.in_features) != (E, r, fin)):
            raise ValueError(f"expert LoRA of layer {layer} {part}: no gate A of the same shape to share")
        a_off = gate.a_off if shares_a else total
        total += 0 if shares_a else E * r * fin
        parts.append(ExpertPart(layer, part, E, r, fin, fout, a_off, total, peft_b, scaling))
        total += E * fout * r
    return tuple(parts), total


def _peft_b(b: torch.Tensor) -> bool:
    """B [E, out, r] is a permuted view of a contiguous [out, r, E] (as adapters/experts.py reads PEFT's lora_B)."""
    return not b.is_contiguous() and b.permute(1, 2, 0).is_contiguous()


def shapes_of(experts: Mapping[tuple[int, str], tuple]) -> dict[tuple[int, str], tuple]:
    """`plan_experts`' input for a LoraAdapter's experts {(layer, part): (A [E, r, in], B [E, out, r], scaling)}: B
    stays in the layout it has (PEFT's when it is a view of it); up shares the gate's A when it is the same tensor."""
    out = {}
    for (layer, part), (a, b, scaling) in experts.items():
        gate = experts.get((layer, "gate"))
        shares = (
            part == "up"
            and gate is not None
            and gate[0].data_ptr() == a.data_ptr()
            and gate[0].shape == a.shape
            and gate[0].stride() == a.stride()
        )
        E, r, fin = a.shape
        out[(layer, part)] = (E, r, fin, b.shape[1], scaling, _peft_b(b), shares)
    return out


def expert_sources(experts: Mapping[tuple[int, str], tuple], parts: tuple[ExpertPart, ...]) -> list[torch.Tensor]:
    """The tensors `pack_adapter` copies in, in buffer order (flattened; B as stored)."""
    out = []
    seen_a = set()
    for p in parts:
        a, b, _ = experts[(p.layer, p.part)]
        if p.a_off not in seen_a:
            seen_a.add(p.a_off)
            out.append(a.reshape(-1))
        out.append((b.permute(1, 2, 0) if p.peft_b else b).reshape(-1))
    return out


class PackedExperts(Mapping):
    """(layer, part) -> (A [E, r, in], B [E, out, r], scaling) as views of the flat buffer, made on first access
    (LoraAdapter.experts' shape, for every use but the slot load)."""

    def __init__(self, flat: torch.Tensor, parts: tuple[ExpertPart, ...]):
        self._flat, self._parts, self._made = flat, {(p.layer, p.part): p for p in parts}, {}

    def __getitem__(self, key: tuple[int, str]) -> tuple:
        hit = self._made.get(key)
        if hit is None:
            p = self._parts[key]
            hit = self._made[key] = (p.a_view(self._flat), p.b_view(self._flat), p.scaling)
        return hit

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def __contains__(self, key) -> bool:
        return key in self._parts
