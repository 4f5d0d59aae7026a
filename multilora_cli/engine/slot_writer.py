"""`SlotWriter`: copies one adapter into a LoRA slot of every layer with a handful of launches.

A Llama-3-8B adapter on all seven projections is 224 (A, B) pairs. Copying them one `set_slot` at a time costs
~900 small operations (two copies and two scalar writes per slice), ~10 ms of host time per slot load. Here:
- the A/B sources: if they are views of ONE pinned host buffer (synthetic adapters, packed loads), that buffer
  goes over in one host->device copy into a staging buffer, then one foreach copy scatters it into the slots;
  otherwise one foreach copy takes them tensor by tensor (still one Python call);
- ranks and scalings of all layers: rows cached per layout on the device, then one copy per slice count into the
  shared rank / scale storage (engine/slot_rows.py).
A `PackedAdapter` (engine/packed.py: what `Engine._load_cpu` returns on CUDA) goes the fastest way: its ONE
buffer reaches the device either ahead of time (a prefetch thread's device copy, engine/staging.py) or here, in
one copy (async from the page-locked arena, engine/pinned.py; ~13 ms and synchronous from pageable memory);
then its ~256 A/B blocks go into the slots in at most three Triton scatter launches (kernels/scatter.py:
consecutive blocks, B blocks transposed into the rank-major slots, anything else) from a plan cached per adapter
layout. A foreach copy of the same blocks runs one copy kernel per block and took 2.4-3.2x the scatter's host
time per load (H200), so CUDA always scatters; on CPU the packed blocks go over in one foreach copy of their views.
The slot tensors are addressed through `LoraWeights`' logical views (a[slot, i, :r], b[slot, lo:hi, :r]), so any
storage layout of `LoraWeights` works.
MoE bases: the expert LoRA slots (engine/expert_slots.py) take the packed expert parts from the same buffer, in
the same scatter launches (their views added to the plan), and their scale / rank rows in one foreach copy.
DoRA adapters: their magnitudes come in the same packed buffer (engine/packed.py), are gathered into one row on the
device, and `DoraNorms` (engine/dora.py) turns them into the slot's scale rows in a few batched ops, no host sync.
Streams (CUDA), the ordering invariant of every slot write, loads made ahead of admission (Engine's preloads,
while one or two steps are in flight with run-ahead) included:
- a load (device copy of its staged or host buffer, scatter of A / B, rank / scale rows, DoRA norms) runs on the
  writer's load stream, beside the steps already enqueued on the compute stream; the compute stream waits for its
  event before the first step that reads the slot (`wait_for`, called by the runner with each step's slots) or a
  `clear` of it, so that step sees all of it, and steps that read other slots run on;
- eviction (`clear`) zeroes the rank / scale / DoRA rows on the compute stream, after every step enqueued so far,
  and records an event there; the next load into that slot waits for it on the load stream: a step enqueued or
  launched ahead before the eviction (a sequence that stopped at the step before still rides the ahead step)
  reads the old adapter to its end. Only unpinned adapters are evicted, and a step is enqueued only with its
  sequences' adapters pinned, so no step enqueued after the eviction reads the slot until the new load;
- a never-used slot has no event (nothing reads it); embed_tokens / lm_head slots (layers/vocab_lora.py) are
  written on the compute stream itself (ordered both ways by the stream);
- buffers the load reads: a staging buffer is refilled after the load's event (engine/staging.py), an arena block
  after its recorded event (engine/pinned.py); temporaries are allocated on the load stream that uses them.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from multilora_cli.engine.dora import DoraNorms
from multilora_cli.engine.expert_slots import ExpertSlots
from multilora_cli.engine.packed import PackedAdapter, magnitude_region
from multilora_cli.engine.slot_rows import SlotRows
from multilora_cli.engine.staging import DeviceStager
from multilora_cli.errors import EngineError
from multilora_cli.kernels.scatter import ScatterPlan, scatter_blocks, scatter_plan
from multilora_cli.layers.lora import LoRALinear


class SlotWriter:
    """Writes adapters into the slots of `modules` ({(layer, fused name): LoRALinear}) on `device`.

    Python-side tensor views are the expensive part of a load (~900 of them), so they are cached: destination
    views per (slot, ranks of every slice), source views into the staging buffer per source layout, scatter plans
    and rank / scaling rows (on the device) per packed layout. No host sync: small host buffers come fresh from
    PyTorch's pinned allocator, which keeps them until the copy ran.
    """

    def __init__(
        self, modules: dict[tuple[int, str], LoRALinear], device: torch.device, experts: ExpertSlots | None = None
    ):
        self.modules = list(modules.items())
        self.experts = experts if experts is not None and experts.modules else None  # MoE expert LoRA slots
        self.device = device
        self.cuda = device.type == "cuda"
        self.width = max((m.lora.n_slices for _, m in self.modules), default=1)
        self._rows = SlotRows(self.modules)  # every module's rank / scale rows: a slot of all is one view per k
        self._staging: torch.Tensor | None = None
        self._dst: dict[tuple, list[torch.Tensor]] = {}  # `_destinations` (unpacked loads)
        self._src: dict[tuple, list[torch.Tensor]] = {}
        self.stager: DeviceStager | None = None  # set by the runner on CUDA: device copies made ahead of loads
        # CUDA: each load's scatter (kernels/scatter.py) runs a plan cached per layout (built for slot 0 and
        # shifted by the slot at launch, so a pool of 1,000 slots builds one plan, not 1,000); offsets are taken
        # from the first module's A tensor
        self._plans: dict[tuple, ScatterPlan] = {}
        self._dst_base = self.modules[0][1].lora.a if self.modules else None
        if self._dst_base is None and self.experts is not None:
            self._dst_base = next(iter(self.experts.modules.values())).gu_a
        self._dora: DoraNorms | None = None  # DoRA scale rows, written per install (engine/dora.py)
        self._rank_cache: dict[tuple, list] = {}  # `_rank_rows`
        self._mag_index: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # packed magnitudes -> row, per layout
        # CUDA: loads run on this stream; `_evicted[slot]`: an event after the steps that may still read the slot
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._evicted: dict[int, torch.cuda.Event] = {}
        self._loading: dict[int, torch.cuda.Event] = {}  # slot -> its load's event, until a step waits for it
        # timed waits (`wait_for(timed=True)`): (before, after) events around a step's wait on a load still copying
        self._stalls: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._stall_seconds = 0.0
        self.stalled_steps = 0
        # packed loads the host did not check for NaN / Inf (`PackedAdapter.unchecked`): the device checks the
        # copy (kernels/finite.py) and holds the slot's ranks at 0 if it fails; slot -> the event after which
        # `_verdict_host[slot]` holds the flag (`bad_slots`)
        self._verdict: dict[int, torch.cuda.Event] = {}
        self._verdict_dev: torch.Tensor | None = None  # [max_loras] int32
        self._verdict_host: torch.Tensor | None = None  # [max_loras] int32, page-locked
        self.device_checks = 0

    def dry_run(self) -> None:
        """A packed load's scatter launches, for kernels.launch.collect to record (engine/precompile.py): the
        source a staging buffer (its own allocation, 16-byte aligned, as every staging and staged copy is), the
        plan one row a table; and the device NaN / Inf check of an unchecked load (`_check`). CUDA with LoRA or
        expert LoRA slots only (elsewhere loads copy with torch ops)."""
        if self.cuda and self._dst_base is not None:
            from multilora_cli.kernels.finite import flag_nonfinite

            base = self._dst_base
            plan = ScatterPlan.noop(self.device)
            scatter_blocks(torch.empty(8, dtype=base.dtype, device=self.device), base, plan, shift=0)
            flag = torch.zeros(1, dtype=torch.int32, device=self.device)
            flag_nonfinite(torch.empty(16, dtype=base.dtype, device=self.device), flag)

    @property
    def dora(self) -> bool:
        return self._dora is not None

    def enable_dora(self) -> None:
        """Give every module DoRA scale rows (ones), before CUDA graphs are captured so they include the scaling."""
        if self.modules and self._dora is None:
            self._dora = DoraNorms(self.modules, self.device)

    @property
    def staged_numel(self) -> int:
        """Elements of the largest packed adapter these slots take (A / B at the max rank, and DoRA magnitudes):
        what a device staging buffer must hold (engine/staging.py)."""
        numel = sum(
            m.lora.max_rank * (m.lora.n_slices * m.lora.in_features + m.lora.out_features) for _, m in self.modules
        )
        if self.experts is not None:
            numel += self.experts.max_numel
        if self._dora is not None:  # engine/packed.py: an even offset, then 2 elements per float32
            numel += 1 + 2 * self._dora.total
        return numel

    def install(self, slot: int, adapter) -> None:
        """Copy `adapter` (adapters.peft.LoraAdapter: slices_for(layer, fused)) into `slot` of every module."""
        if self.stream is None:
            self._install(slot, adapter)
            return
        evicted = self._evicted.pop(slot, None)
        if evicted is not None:
            self.stream.wait_event(evicted)
        with torch.cuda.stream(self.stream):
            try:
                self._install(slot, adapter)
            except BaseException:
                self._verdict.pop(slot, None)  # the slot goes back unused: no verdict of this load may outlive it
                raise
            done = torch.cuda.Event()
            done.record(self.stream)
        self._loading[slot] = done  # the first step that reads the slot waits for it (`wait_for`)

    def wait_for(self, slots, timed: bool = False) -> None:
        """Order the compute stream after the loads still pending into `slots` (a step's slots, -1 = base):
        call before enqueuing anything that reads them. A load into a slot no step reads yet (a preload, while
        the running steps use others) holds nothing back: waiting for every load stalled each decode step that
        followed a preload's ~37 ms copy of a 1.7 GB MoE adapter (issue 37). `timed`: when a load is still
        copying as the step is enqueued, time the compute stream's wait (`stall_seconds`)."""
        if not self._loading:
            return
        compute = torch.cuda.current_stream(self.device)
        pending = [ev for ev in (self._loading.pop(slot, None) for slot in set(slots)) if ev is not None]
        before = None
        if timed and not all(ev.query() for ev in pending):
            before = torch.cuda.Event(enable_timing=True)
            before.record(compute)
        for ev in pending:
            compute.wait_event(ev)
        if before is not None:
            after = torch.cuda.Event(enable_timing=True)
            after.record(compute)
            self._stalls.append((before, after))
            self.stalled_steps += 1

    def stall_seconds(self) -> float:
        """GPU time the compute stream spent in timed waits for loads, over those that have completed. The wait
        starts when the stream reaches it (after the step before), so a load that finished under earlier work
        counts nothing."""
        left = []
        for before, after in self._stalls:
            if after.query():
                self._stall_seconds += before.elapsed_time(after) / 1e3
            else:
                left.append((before, after))
        self._stalls = left
        return self._stall_seconds

    def wait_all(self) -> None:
        """Order the compute stream after every pending load: for reads of the slots outside a step (the GPU
        tests read slot tensors back); steps use `wait_for`."""
        self.wait_for(list(self._loading))

    def _install(self, slot: int, adapter) -> None:
        if isinstance(adapter, PackedAdapter) and adapter.flat is not None:
            m_row = self._install_packed(slot, adapter)  # the magnitudes from the packed copy, if it has them
        else:
            self._install_views(slot, adapter)
            if self.experts is not None:
                self.experts.install_tensors(slot, getattr(adapter, "experts", {}))
            m_row = None
        mags = getattr(adapter, "magnitudes", None)
        if self._dora is not None:  # after A / B / ranks / scales are in the slot: the norms read them
            if m_row is None and mags:  # not packed (CPU, MoE): one row built on the host, one copy
                m_row = self._dora.host_row(mags)
                m_row = m_row.pin_memory().to(self.device, non_blocking=True) if self.cuda else m_row
            self._dora.write(slot, m_row)
        elif mags and self.modules:
            raise EngineError(
                f"adapter {adapter.name!r} is a DoRA adapter but the engine was started without DoRA rows",
                hint="this is a bug: the engine enables DoRA when any adapter of the run uses it",
            )

    def _install_views(self, slot: int, adapter) -> None:
        n = len(self.modules)
        ranks = np.zeros((n, self.width), dtype=np.int32)
        scales = np.zeros((n, self.width), dtype=np.float32)
        src = []
        for j, ((layer, fused), module) in enumerate(self.modules):
            w = module.lora
            slices = adapter.slices_for(layer, fused)
            if len(slices) != w.n_slices:
                raise ValueError(f"layer {layer} {fused}: {len(slices)} slices for a {w.n_slices}-slice module")
            for i, item in enumerate(slices):
                if item is None:
                    continue
                a, b, scaling = item
                r = a.shape[0]
                lo, hi = w.slice_offsets[i], w.slice_offsets[i + 1]
                if r > w.max_rank or a.shape[1] != w.in_features or tuple(b.shape) != (hi - lo, r):
                    raise ValueError(
                        f"layer {layer} {fused} slice {i}: A {tuple(a.shape)} / B {tuple(b.shape)} "
                        "do not fit this layer"
                    )
                src += [a, b]
                ranks[j, i] = r
                scales[j, i] = float(scaling)
        dst = self._destinations(slot, ranks)
        if dst:
            on_dev = self._on_device(src)
            if on_dev is src and self.cuda:  # host tensors not packed in one buffer: one copy each
                for d, t in zip(dst, src):
                    d.copy_(t, non_blocking=True)
            else:
                torch._foreach_copy_(dst, on_dev, non_blocking=True)
        self._rows.write(slot, self._rows.split(ranks, scales, self._to_device))

    def _install_packed(self, slot: int, p: PackedAdapter) -> torch.Tensor | None:
        """One H2D copy of `p.flat` into the staging buffer (unless staged ahead), one scatter of its blocks
        into `slot` (CPU: one foreach copy). Returns the DoRA magnitudes as a device row (`DoraNorms.write`), or
        None without (or without DoRA rows), read from the same copy before its buffer is given back."""
        rows = self._rank_rows(p)
        flat = p.flat
        staged = self.stager.take(p) if self.stager is not None else None
        if staged is not None:  # copied to the device by the prefetch thread: only the scatter is left
            base = staged
        elif self.cuda:
            if self._staging is None or self._staging.numel() < flat.numel() or self._staging.dtype != flat.dtype:
                self._staging = torch.empty(flat.numel(), dtype=flat.dtype, device=self.device)
                self._src.clear()
            self._staging[: flat.numel()].copy_(flat, non_blocking=True)  # async from an arena block
            if p.block is not None:
                p.block.record()
            base = self._staging
        else:
            base = flat
        parts = p.plan.experts if p.plan is not None else ()
        if parts and self.experts is None:
            raise ValueError(f"adapter {p.name!r} has expert LoRA, which has no slots here")
        if self.experts is not None:
            self.experts.prepare(slot, parts)  # zeroes the slot if the last adapter's values would stay behind
        if self.cuda and self._dst_base is not None:  # every A/B block of the adapter, a launch per table
            scatter_blocks(base, self._dst_base, self._plan(p, base), shift=slot)
        else:
            dst, src, _ = self._all_views(slot, p, base)
            if dst:
                torch._foreach_copy_(dst, src, non_blocking=True)
        if self.experts is not None:
            self.experts.write_rows(slot, parts)
        m_row = None
        if self._dora is not None and p.plan is not None and p.plan.mags:
            idx = self._mag_index.get(p.plan.mags)
            if idx is None:
                idx = self._mag_index[p.plan.mags] = self._dora.packed_index(p.plan.mags)
            m_row = torch.where(idx[1], magnitude_region(base, p.plan)[idx[0]], math.nan)  # [total] float32
        flag = None
        if self.cuda and p.unchecked:  # before the staged buffer goes back: the check reads it
            flag = self._check(slot, base[: p.plan.ab_total])  # (unchecked: from read_packed, which plans)
        if staged is not None:
            self.stager.release(staged)
        self._rows.write(slot, rows)
        if flag is not None:
            self._gate(slot, flag)
        return m_row

    # --- the device's NaN / Inf check of an unchecked packed load -----------------------------------------------
    def _check(self, slot: int, values: torch.Tensor) -> torch.Tensor:
        """Flag (device int32 [1]: 1 = a NaN / Inf) of the A / B values just copied, on the load stream."""
        from multilora_cli.kernels.finite import flag_nonfinite

        if self._verdict_dev is None:
            n = self._max_loras()
            self._verdict_dev = torch.zeros(n, dtype=torch.int32, device=self.device)
            self._verdict_host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        flag = self._verdict_dev[slot : slot + 1]
        flag.zero_()
        flag_nonfinite(values, flag)
        self.device_checks += 1
        return flag

    def _gate(self, slot: int, flag: torch.Tensor) -> None:
        """Rank 0 in every module's and expert layer's row of `slot` where `flag` is raised (the kernels then read
        none of its values: a NaN cannot reach another row through a shared tile), then the flag to the host,
        then the event `bad_slots` waits for. All on the load stream, before the load's own event."""
        ok = 1 - flag[0]  # int32, 0-dim
        for _, r, _ in self._rows.groups:
            r[:, slot].mul_(ok)
        if self.experts is not None:
            torch._foreach_mul_([w.rank[slot] for w in self.experts.modules.values()], ok)
        self._verdict_host[slot : slot + 1].copy_(flag, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record(self.stream)
        self._verdict[slot] = ev

    def bad_slots(self, slots) -> list[int]:
        """Those of `slots` (a step's, -1 = base) whose device check found a NaN / Inf, among the checks not read
        yet (each is read once). Call after the step that read them completed: their loads' events, which that
        step waited for, follow the flags' copies, so this rarely waits (it does for a load into a slot that an
        ahead step's finished sequence still names, made after that step was launched)."""
        bad = []
        for slot in set(slots):
            ev = self._verdict.pop(slot, None)
            if ev is None:
                continue
            ev.synchronize()
            if int(self._verdict_host[slot]) != 0:
                bad.append(slot)
        return bad

    def _max_loras(self) -> int:
        if self.modules:
            return self.modules[0][1].lora.max_loras
        return next(iter(self.experts.modules.values())).rank.shape[0]

    def _rank_rows(self, p: PackedAdapter) -> list:
        """The device rows of ranks and scalings `p` puts in a slot (`SlotRows.split`), cached per (layout,
        scalings): a run's adapters mostly share a few, so a load copies them device to device (no host buffer,
        no H2D copy, no per-module Python loop). Checks that every module `p` adapts exists here with its slice
        count."""
        groups = p.groups
        key = (p.layout, tuple(g.scalings for g in groups.values()))
        hit = self._rank_cache.get(key)
        if hit is not None:
            return hit
        n = len(self.modules)
        ranks = np.zeros((n, self.width), dtype=np.int32)
        scales = np.zeros((n, self.width), dtype=np.float32)
        for j, (mkey, module) in enumerate(self.modules):
            g = groups.get(mkey)
            if g is not None:
                k = len(g.ranks)
                if k != module.lora.n_slices:
                    raise ValueError(f"layer {mkey[0]} {mkey[1]}: {k} slices for a {module.lora.n_slices}-slice module")
                ranks[j, :k] = g.ranks
                scales[j, :k] = g.scalings
        if len(groups) > sum(1 for mkey, _ in self.modules if mkey in groups):
            extra = sorted(set(groups) - {mkey for mkey, _ in self.modules})
            raise ValueError(f"adapter {p.name!r} adapts {extra[0]}, which has no LoRA module here")
        if len(self._rank_cache) >= 256:  # distinct layouts x scalings of a run: few; bound it anyway
            self._rank_cache.clear()
        hit = self._rank_cache[key] = self._rows.split(ranks, scales, self._to_device)
        return hit

    def _plan(self, p: PackedAdapter, base: torch.Tensor) -> ScatterPlan:
        """The scatter plan of a layout, cached: slot 0's destinations with each one's slot stride (the launch
        shifts them to the slot). Offsets are relative to `base`, so one plan serves every staging buffer. Packed
        adapters come in the slots' dtype (Engine._pack, direct_read); another dtype is a ValueError."""
        if p.layout not in self._plans:
            dst, src, steps = self._all_views(0, p, base)
            self._plans[p.layout] = scatter_plan(dst, src, base, self._dst_base, steps)
        return self._plans[p.layout]

    def _all_views(self, slot: int, p: PackedAdapter, base: torch.Tensor):
        """(slot views, views of `base`, slot strides) of the dense blocks, then of the expert parts."""
        dst, src = self._packed_views(slot, p.groups, base)
        steps = self._slot_steps(p.groups)
        parts = p.plan.experts if p.plan is not None else ()
        if parts:
            e_dst, e_src, e_steps = self.experts.views(slot, parts, base)
            dst, src, steps = dst + e_dst, src + e_src, steps + e_steps
        return dst, src, steps

    def _slot_steps(self, groups) -> list[int]:
        """Per destination of `_packed_views`, in its order: the element stride from one slot to the next."""
        steps = []
        for key, module in self.modules:
            g = groups.get(key)
            if g is None:
                continue
            w = module.lora
            n = 1 if g.uniform else sum(offs is not None for offs in g.slice_offs)
            steps += [w.a.stride(0), w.b.stride(0)] * n
        return steps

    def _packed_views(self, slot: int, groups, base: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(slot views, views of `base` laid out as packed.py describes), checked against each module's shape."""
        dst, src = [], []
        for (layer, fused), module in self.modules:
            g = groups.get((layer, fused))
            if g is None:
                continue
            w = module.lora
            outs = [w.slice_offsets[i + 1] - w.slice_offsets[i] for i in range(w.n_slices)]
            if (
                max(g.ranks) > w.max_rank
                or g.in_features != w.in_features
                or any(o and o != want for o, want in zip(g.outs, outs))
            ):
                raise ValueError(
                    f"layer {layer} {fused}: packed ranks {g.ranks} / in {g.in_features} / out "
                    f"{g.outs} do not fit this layer"
                )
            fin = g.in_features
            if g.uniform:
                r, k, out = g.ranks[0], w.n_slices, w.out_features
                dst += [w.a[slot, :, :r], w.b[slot, :, :r]]
                src += [
                    base[g.a_off : g.a_off + k * r * fin].view(k, r, fin),
                    base[g.b_off : g.b_off + out * r].view(out, r),
                ]
                continue
            for i, offs in enumerate(g.slice_offs):
                if offs is None:
                    continue
                r, lo, hi = g.ranks[i], w.slice_offsets[i], w.slice_offsets[i + 1]
                dst += [w.a[slot, i, :r], w.b[slot, lo:hi, :r]]
                src += [
                    base[offs[0] : offs[0] + r * fin].view(r, fin),
                    base[offs[1] : offs[1] + (hi - lo) * r].view(hi - lo, r),
                ]
        return dst, src

    def clear(self, slot: int) -> None:
        """Forget the adapter in `slot` (rank 0 and scaling 0 in every module; weights left as they are)."""
        if not self.modules and self.experts is None:
            return
        self.wait_for([slot])  # a load still pending into it lands before the clear, not over it
        self._verdict.pop(slot, None)  # a check nobody read: its adapter is checked again at its next load
        if self.experts is not None:
            self.experts.clear(slot)
        self._rows.clear(slot)
        if self._dora is not None:  # not needed for correctness (an install rewrites it), but a cleared slot is plain
            self._dora.rows[slot].fill_(1.0)
        if self.cuda:  # a load into this slot waits for the steps enqueued so far (they may still read it)
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self._evicted[slot] = ev

    def _host(self, arr: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(arr)
        return t.pin_memory() if self.cuda else t

    def _to_device(self, arr: np.ndarray) -> torch.Tensor:
        """A small host array (a fresh one: `SlotRows.split`'s) on the device, async from a pinned copy on CUDA."""
        return self._host(arr).to(self.device, non_blocking=True) if self.cuda else torch.from_numpy(arr)

    def _destinations(self, slot: int, ranks: np.ndarray) -> list[torch.Tensor]:
        """A/B slot views of `slot` in source order (unpacked loads), cached per (slot, ranks)."""
        key = (slot, ranks.tobytes())
        hit = self._dst.get(key)
        if hit is not None:
            return hit
        dst = []
        for j, (_, module) in enumerate(self.modules):
            w = module.lora
            for i in range(w.n_slices):
                r = int(ranks[j, i])
                if r:
                    lo, hi = w.slice_offsets[i], w.slice_offsets[i + 1]
                    dst += [w.a[slot, i, :r], w.b[slot, lo:hi, :r]]
        self._dst[key] = dst
        return dst

    def _on_device(self, src: list[torch.Tensor]) -> list[torch.Tensor]:
        """Device copies of `src`: ONE copy of their shared pinned storage when they have one, else `src`."""
        if not self.cuda or not src:
            return src
        storage = src[0].untyped_storage()
        ptr, dtype = storage.data_ptr(), src[0].dtype
        if not (src[0].is_pinned() and all(t.untyped_storage().data_ptr() == ptr and t.dtype == dtype for t in src)):
            return src
        flat = torch.empty(0, dtype=dtype).set_(storage)  # the whole host buffer, 1-D
        if self._staging is None or self._staging.numel() < flat.numel() or self._staging.dtype != dtype:
            self._staging = torch.empty(flat.numel(), dtype=dtype, device=self.device)
            self._src.clear()
        self._staging[: flat.numel()].copy_(flat, non_blocking=True)
        key = (dtype, flat.numel(), tuple((t.storage_offset(), t.shape, t.stride()) for t in src))
        views = self._src.get(key)
        if views is None:
            views = self._src[key] = [self._staging.as_strided(t.shape, t.stride(), t.storage_offset()) for t in src]
        return views
