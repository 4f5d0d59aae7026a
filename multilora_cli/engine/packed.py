"""`pack_adapter`: one adapter's A/B tensors copied into ONE (pinned) host buffer laid out like the slots.

`SlotWriter` then loads it with one host->device copy of the whole buffer and one foreach copy that scatters
the staging buffer into the slots. The layout mirrors `LoraWeights` so those scatter copies are few and dense:
per fused module (layer, "qkv_proj" ...) whose slices are all adapted at the same rank r ("uniform"):
    A block [n_slices, r, in]      -> slot a[slot, :, :r, :]  (dense when r == max_rank, or one slice)
    B block [out_total, r]         -> slot b[slot, :, :r]     (the device copy transposes into rank-major slots)
other modules (some slices missing, or ranks differ): per adapted slice A [r, in] and B [out_slice, r].
Every block is a source tensor as PEFT stores it, so packing is one `torch.cat` (one memcpy, GIL released)
rather than hundreds of small and strided copies on the prefetch thread. The returned adapter's modules are
views of that buffer (A [r, in], B [out, r]), so it is still an ordinary `LoraAdapter` for every other use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from multilora_cli.adapters.peft import SLICES, LoraAdapter, LoraModule
from multilora_cli.models.config import FUSED


@dataclass(frozen=True, slots=True)
class PackedGroup:
    """Where one fused module's slices sit in the flat buffer (element offsets).

    uniform: a_off -> [n, r, in], b_off -> [r, out_total]; else per slice (a_off, b_off) or None (not adapted).
    """

    uniform: bool
    ranks: tuple[int, ...]  # per slice, 0 = not adapted
    scalings: tuple[float, ...]
    in_features: int
    outs: tuple[int, ...]  # per slice output features (0 where not adapted and unknown)
    a_off: int = 0
    b_off: int = 0
    slice_offs: tuple[tuple[int, int] | None, ...] = ()


@dataclass  # no slots: an arena block is given back when this object dies (weakref, engine/pinned.py)
class PackedAdapter(LoraAdapter):
    """A `LoraAdapter` whose tensors are views of `flat` (1-D); `groups` keyed (layer, fused). `block`: the
    `PinnedBlock` holding `flat` when it came from a `PinnedArena` (page-locked: device copies are async)."""

    flat: torch.Tensor | None = None
    groups: dict[tuple[int, str], PackedGroup] = field(default_factory=dict)
    layout: tuple = ()  # hashable summary of `groups` (offsets + ranks): equal layouts share cached views
    staged: tuple | None = None  # set by engine/staging.py: (buffer index, copy-done event) of a device copy
    block: object | None = None  # engine/pinned.PinnedBlock, or None (pageable or pinned by PyTorch)


def pack_adapter(adapter: LoraAdapter, *, pin: bool, dtype: torch.dtype | None = None,
                 arena=None) -> PackedAdapter:
    """Copy `adapter` into one host buffer in the slot-like layout above: a block of `arena` (a PinnedArena)
    when it has room, else a fresh buffer (pinned by PyTorch if `pin`)."""
    dtype = dtype or next(iter(adapter.modules.values())).a.dtype
    by_group: dict[tuple[int, str], list[LoraModule | None]] = {}
    for (layer, name), m in adapter.modules.items():
        fused, i = FUSED[name]
        by_group.setdefault((layer, fused), [None] * len(SLICES[fused]))[i] = m
    plan, total = [], 0
    for key in sorted(by_group):
        mods = by_group[key]
        ranks = tuple(m.rank if m is not None else 0 for m in mods)
        outs = tuple(m.b.shape[0] if m is not None else 0 for m in mods)
        fin = next(m.a.shape[1] for m in mods if m is not None)
        uniform = all(m is not None for m in mods) and len(set(ranks)) == 1
        if uniform:
            r = ranks[0]
            a_off, b_off = total, total + len(mods) * r * fin
            total = b_off + r * sum(outs)
            plan.append((key, mods, PackedGroup(True, ranks, tuple(m.scaling for m in mods), fin, outs, a_off, b_off)))
        else:
            offs = []
            for m, r, o in zip(mods, ranks, outs):
                if m is None:
                    offs.append(None)
                    continue
                offs.append((total, total + r * fin))
                total += r * (fin + o)
            plan.append((key, mods, PackedGroup(False, ranks, tuple(m.scaling if m else 0.0 for m in mods), fin,
                                                outs, slice_offs=tuple(offs))))
    # ONE copy op fills the buffer (sources in buffer order; B stays [out, r] as PEFT stores it, so every
    # source is contiguous: a plain memcpy, no strided transpose on the CPU; the slot scatter on the device
    # does the transpose into the rank-major slots)
    srcs: list[torch.Tensor] = []
    for _, mods, g in plan:
        if g.uniform:
            srcs += [m.a for m in mods] + [m.b for m in mods]
        else:
            for m in mods:
                if m is not None:
                    srcs += [m.a, m.b]
    block = arena.alloc(total * dtype.itemsize) if arena is not None else None
    flat = block.tensor(total, dtype) if block is not None else torch.empty(total, dtype=dtype, pin_memory=pin)
    if srcs:
        torch.cat([t.to(dtype).reshape(-1) for t in srcs], out=flat)
    modules: dict[tuple[int, str], LoraModule] = {}
    groups: dict[tuple[int, str], PackedGroup] = {}
    for (layer, fused), mods, g in plan:
        groups[(layer, fused)] = g
        names = SLICES[fused]
        if g.uniform:
            r, fin = g.ranks[0], g.in_features
            lo = 0
            for i, m in enumerate(mods):
                a = flat[g.a_off + i * r * fin:g.a_off + (i + 1) * r * fin].view(r, fin)
                b = flat[g.b_off + lo * r:g.b_off + (lo + g.outs[i]) * r].view(g.outs[i], r)
                modules[(layer, names[i])] = LoraModule(a=a, b=b, scaling=m.scaling)
                lo += g.outs[i]
        else:
            for i, (m, offs) in enumerate(zip(mods, g.slice_offs)):
                if m is None:
                    continue
                r, o = g.ranks[i], g.outs[i]
                a = flat[offs[0]:offs[0] + r * g.in_features].view(r, g.in_features)
                b = flat[offs[1]:offs[1] + o * r].view(o, r)
                modules[(layer, names[i])] = LoraModule(a=a, b=b, scaling=m.scaling)
    layout = (dtype, total, tuple((k, g.uniform, g.ranks, g.outs, g.a_off, g.b_off, g.slice_offs)
                                  for k, g in groups.items()))
    packed = PackedAdapter(name=adapter.name, path=adapter.path, config=adapter.config, modules=modules,
                           base_model=adapter.base_model, weights_path=adapter.weights_path,
                           stored_dtype=adapter.stored_dtype, stored_nbytes=adapter.stored_nbytes,
                           module_names=dict(adapter.module_names), flat=flat, groups=groups, layout=layout,
                           block=block)
    if block is not None:
        arena.adopt(block, packed)
    return packed
