"""`ExpertSlots`: a MoE base's expert LoRA slots (kernels/expert_weights.py, one per sparse layer) as destinations of
the slot writer's packed loads (engine/slot_writer.py).

A Qwen3-30B-A3B rank-16 adapter holds 48 layers x 128 experts of gate, up and down LoRA (1.26 GB bf16). Loaded part
by part (`install_tensors`, `ExpertLoraWeights.set_slot`) that is ~1,000 launches and a synchronous 1.5 GB copy
from pageable memory on the step loop's thread per load. Packed (engine/packed_experts.py) it is the same ONE
host->device copy and ONE scatter launch as the dense modules: `views` gives each part's (slot view, view of the
packed buffer) pairs, with the layout changes as strides of the slot views:
    A [E, r, in]   -> gu_a[slot, :, col:col+r, :] (gate col 0, up col R) | dn_a[slot, :, :r, :]
    B [E, out, r]  -> gu_b[slot, :, rows, :r] (gate rows 0..I, up rows I..2I) | dn_b[slot, :, :, :r]
    B [out, r, E]  -> the same slot view permuted to [out, r, E] (PEFT's lora_B: the transpose runs on the device)
then `write_rows` copies the slot's scale, rank and `shared` rows from device rows cached per (ranks, scalings,
shared A): shared where a layer's up part reads the gate's A in the buffer (PEFT's one lora_A of gate_up_proj)
with the gate's rank and scaling, so the fused shrink reads that A once.
Stale values: a slot is zeroed (`prepare`) only when the parts written last differ from the new ones (any rank,
layer or part); with the same parts every value is overwritten. Eviction zeroes the rank and scale rows only (the
kernels skip a rank-0 slot; moe_reference multiplies its rows by scale 0).
"""

from __future__ import annotations

import numpy as np
import torch

from multilora_cli.engine.packed_experts import ExpertPart
from multilora_cli.kernels.expert_weights import ExpertLoraWeights

_ZEROS: tuple = ()  # `_written` of a slot holding zeros only


class ExpertSlots:
    """{layer: ExpertLoraWeights} of every sparse layer, on `device`."""

    def __init__(self, modules: dict[int, ExpertLoraWeights], device: torch.device):
        self.modules = dict(sorted(modules.items()))
        self.device = device
        self.cuda = device.type == "cuda"
        self._index = {layer: j for j, layer in enumerate(self.modules)}
        self._written: dict[int, tuple | None] = {}  # slot -> parts written last (`_ZEROS` if absent; None: unknown)
        self._rows: dict[tuple, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}  # (ranks, scalings) -> rows
        self.zeroed = 0  # slot zeroings (`prepare`)

    @property
    def max_numel(self) -> int:
        """Elements of the largest packed expert LoRA the slots take (per-expert modules at the max rank)."""
        n = 0
        for w in self.modules.values():
            E, R, H, inter = w.gu_a.shape[1], w.max_rank, w.gu_a.shape[3], w.dn_a.shape[3]
            n += E * R * (3 * H + 3 * inter)  # A of gate, up (H), down (I); B of gate, up (I), down (H)
        return n

    def views(self, slot: int, parts: tuple[ExpertPart, ...], base: torch.Tensor):
        """(slot views, views of `base`, slot strides) of every part, in order; ValueError where a part does not
        fit these slots."""
        dst, src, steps = [], [], []
        for p in parts:
            w = self.modules.get(p.layer)
            if w is None:
                raise ValueError(f"expert LoRA on layer {p.layer}, which has no expert LoRA slots here")
            E, R, H, inter = w.gu_a.shape[1], w.max_rank, w.gu_a.shape[3], w.dn_a.shape[3]
            want = (inter, H) if p.part == "down" else (H, inter)
            if p.experts != E or p.rank > R or (p.in_features, p.out_features) != want:
                raise ValueError(
                    f"layer {p.layer} expert {p.part}: E {p.experts} rank {p.rank} {p.in_features} -> "
                    f"{p.out_features} does not fit these slots (E {E}, max rank {R}, {want[0]} -> {want[1]})"
                )
            r = p.rank
            if p.part == "down":
                da, db, a_t, b_t = w.dn_a[slot, :, :r], w.dn_b[slot, :, :, :r], w.dn_a, w.dn_b
            else:
                col = 0 if p.part == "gate" else R
                rows = slice(0, inter) if p.part == "gate" else slice(inter, 2 * inter)
                da, db, a_t, b_t = w.gu_a[slot, :, col : col + r], w.gu_b[slot, :, rows, :r], w.gu_a, w.gu_b
            dst += [da, db.permute(1, 2, 0) if p.peft_b else db]
            src += [p.a_view(base), p.b_stored(base)]
            steps += [a_t.stride(0), b_t.stride(0)]
        return dst, src, steps

    def prepare(self, slot: int, parts: tuple[ExpertPart, ...]) -> None:
        """Zero `slot` before writing `parts` when values of what it held last would stay behind."""
        if not parts:  # rank rows 0 (`write_rows`): nothing of the slot is read
            return
        key = tuple((p.layer, p.part, p.experts, p.rank) for p in parts)
        prev = self._written.get(slot, _ZEROS)
        if prev != _ZEROS and prev != key:
            torch._foreach_zero_([t[slot] for w in self.modules.values() for t in (w.gu_a, w.gu_b, w.dn_a, w.dn_b)])
            self.zeroed += 1
        self._written[slot] = key

    def write_rows(self, slot: int, parts: tuple[ExpertPart, ...]) -> None:
        """Scale and rank rows of `slot` in every layer (zeros where `parts` adapt nothing): one foreach copy from
        device rows cached per (ranks, scalings), so a load of a known kind copies no host buffer."""
        if not self.modules:
            return
        key = tuple((p.layer, p.part, p.rank, p.scaling, p.a_off) for p in parts)
        hit = self._rows.get(key)
        if hit is None:
            hit = self._rows[key] = self._make_rows(parts)
            if len(self._rows) > 256:  # distinct (ranks, scalings) of a run: few; bound it anyway
                self._rows.pop(next(iter(self._rows)))
        src_s, src_r = hit
        dst_s = [t[slot] for w in self.modules.values() for t in (w.gu_scale, w.dn_scale)]
        dst_r = [t[slot] for w in self.modules.values() for t in (w.rank, w.shared)]
        torch._foreach_copy_(dst_s + dst_r, src_s + src_r)

    def _make_rows(self, parts):
        n, R = len(self.modules), next(iter(self.modules.values())).max_rank
        scales = np.zeros((n, 3 * R), dtype=np.float32)  # gu_scale [2R] then dn_scale [R]
        ranks = np.zeros((n, 2), dtype=np.int32)  # rank, shared
        gates = {}
        for p in parts:
            j = self._index[p.layer]
            col = {"gate": 0, "up": R, "down": 2 * R}[p.part]
            scales[j, col : col + p.rank] = p.scaling
            ranks[j, 0] = max(ranks[j, 0], p.rank)
            if p.part == "gate":
                gates[p.layer] = p
            g = gates.get(p.layer)
            if p.part == "up" and g is not None and (g.a_off, g.rank, g.scaling) == (p.a_off, p.rank, p.scaling):
                ranks[j, 1] = 1
        s_dev, r_dev = (self._to_device(torch.from_numpy(a)) for a in (scales, ranks))
        src_s = [v for j in range(n) for v in (s_dev[j, : 2 * R], s_dev[j, 2 * R :])]
        return src_s, [v for j in range(n) for v in (r_dev[j, 0], r_dev[j, 1])]

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory().to(self.device, non_blocking=True) if self.cuda else t.to(self.device)

    def install_tensors(self, slot: int, experts) -> None:
        """The unpacked path: {(layer, part): (A [E, r, in], B [E, out, r], scaling)} set part by part (every layer
        is cleared first, adapted or not)."""
        for layer, w in self.modules.items():
            parts = {p: experts[(layer, p)] for p in ("gate", "up", "down") if (layer, p) in experts}
            w.set_slot(slot, {p: (a.to(self.device), b.to(self.device), s) for p, (a, b, s) in parts.items()})
        self._written[slot] = None

    def clear(self, slot: int) -> None:
        """Forget the adapter in `slot`: rank and scale rows 0 (its A / B stay until the next load needs them
        gone)."""
        if self.modules:
            rows = [t[slot] for w in self.modules.values() for t in (w.gu_scale, w.dn_scale, w.rank, w.shared)]
            torch._foreach_zero_(rows)
