"""`SlotWriter`: copies one adapter into a LoRA slot of every layer with a handful of launches.

A Llama-3-8B adapter on all seven projections is 224 (A, B) pairs. Copying them one `set_slot` at a time costs
~900 small operations (two copies and two scalar writes per slice), ~10 ms of host time per slot load. Here:
- the A/B sources: if they are views of ONE pinned host buffer (synthetic adapters, packed loads), that buffer
  goes over in one host->device copy into a staging buffer, then one foreach copy scatters it into the slots;
  otherwise one foreach copy takes them tensor by tensor (still one Python call);
- ranks and scalings of all layers: one small host->device copy, then one foreach copy each.
The slot tensors are addressed through `LoraWeights`' logical views (a[slot, i, :r], b[slot, lo:hi, :r]), so any
storage layout of `LoraWeights` works. Everything stays on the current stream: a step after the install sees it.
"""

from __future__ import annotations

import torch

from multilora_cli.layers.lora import LoRALinear


class SlotWriter:
    """Writes adapters into the slots of `modules` ({(layer, fused name): LoRALinear}) on `device`."""

    def __init__(self, modules: dict[tuple[int, str], LoRALinear], device: torch.device):
        self.modules = list(modules.items())
        self.device = device
        self.cuda = device.type == "cuda"
        n = len(self.modules)
        width = max((m.lora.n_slices for _, m in self.modules), default=1)
        self._ranks = torch.zeros(n, width, dtype=torch.int32, pin_memory=self.cuda)
        self._scales = torch.zeros(n, width, dtype=torch.float32, pin_memory=self.cuda)
        self._ranks_dev = torch.zeros(n, width, dtype=torch.int32, device=device)
        self._scales_dev = torch.zeros(n, width, dtype=torch.float32, device=device)
        self._staging: torch.Tensor | None = None
        self._copied = torch.cuda.Event() if self.cuda else None

    def install(self, slot: int, adapter) -> None:
        """Copy `adapter` (adapters.peft.LoraAdapter: slices_for(layer, fused)) into `slot` of every module."""
        if self._copied is not None:
            self._copied.synchronize()  # the previous install's host buffers have been read
        dst, src = [], []
        ranks, scales = self._ranks.numpy(), self._scales.numpy()
        ranks[:] = 0
        scales[:] = 0
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
                    raise ValueError(f"layer {layer} {fused} slice {i}: A {tuple(a.shape)} / B {tuple(b.shape)} "
                                     "do not fit this layer")
                dst += [w.a[slot, i, :r], w.b[slot, lo:hi, :r]]
                src += [a, b]
                ranks[j, i] = r
                scales[j, i] = float(scaling)
        if dst:
            torch._foreach_copy_(dst, self._on_device(src), non_blocking=True)
        self._ranks_dev.copy_(self._ranks, non_blocking=True)
        self._scales_dev.copy_(self._scales, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        n = [m.lora.n_slices for _, m in self.modules]
        torch._foreach_copy_([m.lora.rank[slot] for _, m in self.modules],
                             [self._ranks_dev[j, :k] for j, k in enumerate(n)])
        torch._foreach_copy_([m.lora.scale[slot] for _, m in self.modules],
                             [self._scales_dev[j, :k] for j, k in enumerate(n)])

    def clear(self, slot: int) -> None:
        """Forget the adapter in `slot` (rank 0 and scaling 0 in every module; weights left as they are)."""
        if not self.modules:
            return
        torch._foreach_zero_([m.lora.rank[slot] for _, m in self.modules])
        torch._foreach_zero_([m.lora.scale[slot] for _, m in self.modules])

    def _on_device(self, src: list[torch.Tensor]) -> list[torch.Tensor]:
        """Device copies of `src`: ONE copy of their shared pinned storage when they have one, else `src`."""
        if not self.cuda or not src:
            return src
        storage = src[0].untyped_storage()
        ptr, dtype = storage.data_ptr(), src[0].dtype
        if not (src[0].is_pinned() and all(t.untyped_storage().data_ptr() == ptr and t.dtype == dtype
                                              for t in src)):
            return src
        flat = torch.empty(0, dtype=dtype).set_(storage)  # the whole host buffer, 1-D
        if self._staging is None or self._staging.numel() < flat.numel() or self._staging.dtype != dtype:
            self._staging = torch.empty(flat.numel(), dtype=dtype, device=self.device)
        self._staging[:flat.numel()].copy_(flat, non_blocking=True)
        return [self._staging.as_strided(t.shape, t.stride(), t.storage_offset()) for t in src]
