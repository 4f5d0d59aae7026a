"""`pack_adapter`: one adapter's A/B tensors copied into ONE (pinned) host buffer laid out like the slots.

`SlotWriter` then loads it with one host->device copy of the whole buffer and one foreach copy that scatters
the staging buffer into the slots. The layout mirrors `LoraWeights` so those scatter copies are few and dense:
per fused module (layer, "qkv_proj" ...) whose slices are all adapted at the same rank r ("uniform"):
    A block [n_slices, r, in]      -> slot a[slot, :, :r, :]  (dense when r == max_rank, or one slice)
    B block [out_total, r]         -> slot b[slot, :, :r]     (the device copy transposes into rank-major slots)
other modules (some slices missing, or ranks differ): per adapted slice A [r, in] and B [out_slice, r].
A DoRA adapter's magnitudes follow the A/B blocks as float32 bytes (at an even element offset, so a float32 view of
the region is aligned whatever the buffer's dtype): m [out] per (layer, PEFT module), in sorted order. They go over
with the same one copy as A and B; the slot load turns them into its scale rows on the device (engine/dora.py).
Every block is a source tensor as PEFT stores it, so packing is one `torch.cat` (one memcpy, GIL released)
rather than hundreds of small and strided copies on the prefetch thread. The returned adapter's modules are
views of that buffer (A [r, in], B [out, r], made when first used), so it is still an ordinary `LoraAdapter` for
every other use. `plan_pack` computes the layout from shapes alone, so engine/direct_read.py can fill the same
buffer straight from a checkpoint file.
MoE expert LoRA (adapters/experts.py) follows the dense A/B blocks, per (layer, part) in layer then gate, up, down
order, each tensor as the checkpoint stores it, so a read is a few large spans and the slot scatter (engine/
expert_slots.py) does every layout change on the device:
    A [E, r, in]                                  (both layouts; PEFT's gate and up share one A)
    B [out, r, E] (PEFT target_parameters: `peft_b`; gate rows then up rows of gate_up_proj, back to back)
      [E, out, r] (per-expert modules; experts the checkpoint leaves out are zeros)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import torch

from multilora_cli.adapters.peft import SLICES, LoraAdapter, LoraModule
from multilora_cli.engine.packed_experts import ExpertPart, PackedExperts, expert_sources, plan_experts, shapes_of
from multilora_cli.models.config import FUSED
from multilora_cli.models.moe_config import SHARED_FUSED

# PEFT module -> (our fused module, slice), Qwen2-MoE's shared expert too (its modules pack like a dense MLP's)
_FUSED = FUSED | {n: (f, i) for f, names in SHARED_FUSED.items() for i, n in enumerate(names)}


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
    plan: PackPlan | None = None  # where everything sits in `flat` (the DoRA magnitudes too)
    staged: tuple | None = None  # set by engine/staging.py: (buffer index, copy-done event) of a device copy
    block: object | None = None  # engine/pinned.PinnedBlock, or None (pageable or pinned by PyTorch)
    # True: A / B were not checked for NaN / Inf on the host (direct_read.read_packed(check=False)); the slot
    # load checks its device copy instead (engine/slot_writer.py)
    unchecked: bool = False

    # from `groups`, not `modules`: those would make every view (PackedModules)
    @property
    def max_rank(self) -> int:
        vocab = self.vocab.max_rank if self.vocab is not None else 0
        experts = [p.rank for p in self.plan.experts] if self.plan is not None else []
        return max([vocab] + [max(g.ranks) for g in self.groups.values()] + experts)

    @property
    def min_rank(self) -> int:
        vocab = [self.vocab.max_rank] if self.vocab is not None and self.vocab.max_rank else []
        experts = [p.rank for p in self.plan.experts] if self.plan is not None else []
        return min(vocab + [r for g in self.groups.values() for r in g.ranks if r] + experts, default=0)

    @property
    def num_params(self) -> int:
        vocab = self.vocab.num_params if self.vocab is not None else 0
        experts = sum(p.a_numel + p.b_numel for p in self.plan.experts) if self.plan is not None else 0
        dense = sum(r * (g.in_features + o) for g in self.groups.values() for r, o in zip(g.ranks, g.outs) if r)
        return vocab + dense + experts


@dataclass(frozen=True, slots=True)
class PackPlan:
    """Where every tensor of an adapter goes in the flat buffer (elements); shared by both packers.

    order: ((layer, PEFT module), "a" | "b", element offset) in buffer order; where: (layer, PEFT module) ->
    ((layer, fused), slice index, A offset, B offset), the one map both the views and the NaN check use."""

    groups: dict[tuple[int, str], PackedGroup]
    total: int
    order: tuple[tuple[tuple[int, str], str, int], ...]
    where: dict[tuple[int, str], tuple[tuple[int, str], int, int, int]]
    # DoRA: the magnitude region starts at element mag_off (even) and holds 2 elements per float32 (room for a
    # float32 view of any 2- or 4-byte dtype); mags: ((layer, PEFT module), float32 offset in it, out) sorted
    mag_off: int = 0
    mags: tuple[tuple[tuple[int, str], int, int], ...] = ()
    ab_end: int = -1  # with magnitudes: where the A/B blocks end (mag_off, or one before it: a zeroed pad)
    experts: tuple[ExpertPart, ...] = ()  # MoE expert LoRA, after the dense blocks (inside the A/B region)

    @property
    def ab_total(self) -> int:
        """Elements of the A/B blocks (the magnitude region follows them)."""
        return self.ab_end if self.mags else self.total

    @property
    def mag_floats(self) -> int:
        return sum(out for _, _, out in self.mags)

    def layout(self, dtype: torch.dtype) -> tuple:
        return (
            dtype,
            self.total,
            tuple((k, g.uniform, g.ranks, g.outs, g.a_off, g.b_off, g.slice_offs) for k, g in self.groups.items()),
            self.mags,
            tuple(p.shape_key for p in self.experts),
        )


def plan_pack(
    shapes: dict[tuple[int, str], tuple[int, int, int, float]],
    mags: Iterable[tuple[int, str]] = (),
    experts: dict[tuple[int, str], tuple[int, int, int, int, float, bool, bool]] | None = None,
) -> PackPlan:
    """The slot-like layout above for modules (layer, PEFT name) -> (rank, in, out, scaling); `mags`: the modules
    with a DoRA magnitude (each of `shapes`' out features); `experts`: (layer, part) -> (E, rank, in, out, scaling,
    peft_b, shares_a), shares_a: an "up" part that uses its layer's gate A (PEFT gate_up_proj)."""
    by_group: dict[tuple[int, str], list] = {}
    for (layer, name), shp in shapes.items():
        fused, i = _FUSED[name]
        by_group.setdefault((layer, fused), [None] * len(SLICES[fused]))[i] = shp
    groups, order, total = {}, [], 0
    for key in sorted(by_group):
        mods = by_group[key]
        names = [(key[0], n) for n in SLICES[key[1]]]
        ranks = tuple(m[0] if m is not None else 0 for m in mods)
        outs = tuple(m[2] if m is not None else 0 for m in mods)
        fin = next(m[1] for m in mods if m is not None)
        if all(m is not None for m in mods) and len(set(ranks)) == 1:  # uniform: A block, then B block
            r = ranks[0]
            a_off, b_off = total, total + len(mods) * r * fin
            order += [(n, "a", a_off + i * r * fin) for i, n in enumerate(names)]
            lo = 0
            for i, n in enumerate(names):
                order.append((n, "b", b_off + lo * r))
                lo += outs[i]
            total = b_off + r * sum(outs)
            groups[key] = PackedGroup(True, ranks, tuple(m[3] for m in mods), fin, outs, a_off, b_off)
        else:
            offs = []
            for n, m, r, o in zip(names, mods, ranks, outs):
                if m is None:
                    offs.append(None)
                    continue
                offs.append((total, total + r * fin))
                order += [(n, "a", total), (n, "b", total + r * fin)]
                total += r * (fin + o)
            groups[key] = PackedGroup(
                False, ranks, tuple(m[3] if m else 0.0 for m in mods), fin, outs, slice_offs=tuple(offs)
            )
    offs = {(n, ab): off for n, ab, off in order}
    slice_of = {n: (g, i) for g in groups for i, n in enumerate((g[0], m) for m in SLICES[g[1]])}
    where = {n: (*slice_of[n], offs[(n, "a")], offs[(n, "b")]) for n in sorted(shapes)}
    parts, total = plan_experts(experts or {}, total)
    mag, floats = [], 0
    for n in sorted(mags):
        mag.append((n, floats, shapes[n][2]))
        floats += shapes[n][2]
    if not mag:
        return PackPlan(groups, total, tuple(order), where, experts=tuple(parts))
    mag_off = total + total % 2
    return PackPlan(groups, mag_off + 2 * floats, tuple(order), where, mag_off, tuple(mag), total, tuple(parts))


def magnitude_region(flat: torch.Tensor, plan: PackPlan) -> torch.Tensor:
    """The float32 view of `flat`'s magnitude region (the packed magnitudes first, then padding for 4-byte dtypes);
    `flat` may be the host buffer or its device copy."""
    return flat[plan.mag_off : plan.total].view(torch.float32)


def fill_magnitudes(
    flat: torch.Tensor, plan: PackPlan, magnitudes: Mapping[tuple[int, str], torch.Tensor] | torch.Tensor
) -> dict[tuple[int, str], torch.Tensor]:
    """Copy the DoRA magnitudes ({(layer, PEFT module): m}, or all of them as one vector in `plan.mags` order, any
    floating dtype) into `flat`'s region (one op; padding zeroed) and return them as float32 views of it."""
    if not plan.mags:
        return {}
    if plan.ab_end < plan.mag_off:
        flat[plan.ab_end : plan.mag_off].zero_()  # the pad to an even offset: defined bytes
    region = magnitude_region(flat, plan)
    n = plan.mag_floats
    if isinstance(magnitudes, torch.Tensor):
        region[:n].copy_(magnitudes)
        region[n:].zero_()
    else:
        srcs = [magnitudes[k].reshape(-1).float() for k, _, _ in plan.mags]
        pad = region.numel() - n
        torch.cat(srcs + [torch.zeros(pad)] if pad else srcs, out=region)
    return {k: region[off : off + out] for k, off, out in plan.mags}


class PackedModules(Mapping):
    """(layer, PEFT module) -> LoraModule whose A [r, in] / B [out, r] are views of the flat buffer, made on first
    access: every view is a torch call that lets go of the GIL, and a reader thread making ~450 of them per
    adapter waits for the step loop's thread at each one (engine/direct_read.py)."""

    def __init__(self, flat: torch.Tensor, plan: PackPlan):
        self._flat, self._plan, self._made = flat, plan, {}

    def __getitem__(self, key: tuple[int, str]) -> LoraModule:
        m = self._made.get(key)
        if m is None:
            gkey, i, a0, b0 = self._plan.where[key]  # KeyError: not adapted
            g = self._plan.groups[gkey]
            r, fin, o = g.ranks[i], g.in_features, g.outs[i]
            flat = self._flat
            m = LoraModule(
                a=flat[a0 : a0 + r * fin].view(r, fin), b=flat[b0 : b0 + o * r].view(o, r), scaling=g.scalings[i]
            )
            self._made[key] = m
        return m

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return iter(self._plan.where)

    def __len__(self) -> int:
        return len(self._plan.where)

    def __contains__(self, key) -> bool:
        return key in self._plan.where


def packed_adapter(
    src: LoraAdapter, flat: torch.Tensor, plan: PackPlan, block, arena, layout: tuple | None = None
) -> PackedAdapter:
    """The PackedAdapter over `flat` (filled per `plan`), with `src`'s metadata; `block` goes back to `arena`
    when it dies. `layout`: `plan.layout(flat.dtype)` when the caller has it already (a `ReadPlan`'s)."""
    packed = PackedAdapter(
        name=src.name,
        path=src.path,
        config=src.config,
        modules=PackedModules(flat, plan),
        base_model=src.base_model,
        weights_path=src.weights_path,
        stored_dtype=src.stored_dtype,
        stored_nbytes=src.stored_nbytes,
        module_names=dict(src.module_names),
        magnitudes=dict(getattr(src, "magnitudes", {})),  # a scan (direct_read) sets them after
        experts=PackedExperts(flat, plan.experts),
        vocab=src.vocab if isinstance(src, LoraAdapter) else None,  # a scan's: direct_read reads them after
        flat=flat,
        groups=plan.groups,
        layout=layout if layout is not None else plan.layout(flat.dtype),
        plan=plan,
        block=block,
    )
    if block is not None:
        arena.adopt(block, packed)
    return packed


def pack_adapter(adapter: LoraAdapter, *, pin: bool, dtype: torch.dtype | None = None, arena=None) -> PackedAdapter:
    """Copy `adapter` into one host buffer in the slot-like layout above: a block of `arena` (a PinnedArena)
    when it has room, else a fresh buffer (pinned by PyTorch if `pin`)."""
    mods, experts = adapter.modules, adapter.experts
    if dtype is None:
        dtype = next(iter(mods.values())).a.dtype if mods else next(iter(experts.values()))[0].dtype
    mags = getattr(adapter, "magnitudes", None) or {}
    shapes = {k: (m.rank, m.a.shape[1], m.b.shape[0], m.scaling) for k, m in mods.items()}
    plan = plan_pack(shapes, mags, shapes_of(experts))
    block = arena.alloc(plan.total * dtype.itemsize) if arena is not None else None
    flat = (
        block.tensor(plan.total, dtype) if block is not None else torch.empty(plan.total, dtype=dtype, pin_memory=pin)
    )
    # ONE copy op fills the buffer (sources in buffer order; B stays [out, r] as PEFT stores it, so every
    # source is contiguous: a plain memcpy, no strided transpose on the CPU; the slot scatter on the device
    # does the transpose into the rank-major slots)
    srcs = [getattr(mods[n], ab) for n, ab, _ in plan.order] + expert_sources(experts, plan.experts)
    if srcs:
        torch.cat([t.to(dtype).reshape(-1) for t in srcs], out=flat[: plan.ab_total])
    packed = packed_adapter(adapter, flat, plan, block, arena)
    if mags:  # views of the buffer: the magnitudes travel with A / B (and are not kept twice)
        packed.magnitudes = fill_magnitudes(flat, plan, mags)
    return packed
