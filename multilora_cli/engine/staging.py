"""`DeviceStager`: packed adapters copied to the GPU by the prefetch thread, ahead of their slot load.

Why: at slot-load time the host->device copy of a packed adapter sits on the step loop: ~13 ms of blocked
thread per 84 MB from pageable memory (adapters that did not fit the pinned arena, engine/pinned.py), and
~1.6 ms of copy on the compute stream from page-locked memory. Here it runs ahead, on the prefetch thread and
a side stream, while steps run, and the slot load that follows is a device-to-device scatter (`SlotWriter`)
ordered after the copy by an event.

`n_buffers` device buffers of `numel` elements are allocated up front (the runner counts them before sizing
the KV cache). `stage` never waits for a buffer: when none is free it takes back the one staged longest ago
(that adapter then loads the ordinary way), so adapters that are staged and never installed cannot starve
later ones. A buffer whose scatter was enqueued is reused only after that scatter ran (an event).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

_FREE, _FILLING, _STAGED, _TAKEN = "free", "filling", "staged", "taken"


class DeviceStager:
    """Device staging buffers for packed adapters (objects with `flat` and a `staged` attribute)."""

    def __init__(self, device: torch.device, numel: int, dtype: torch.dtype, n_buffers: int = 2):
        if n_buffers < 1 or numel < 1:
            raise ValueError(f"DeviceStager needs n_buffers >= 1 and numel >= 1, got {n_buffers}, {numel}")
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.buffers = [torch.empty(numel, dtype=dtype, device=device) for _ in range(n_buffers)]
        self._state = [_FREE] * n_buffers
        self._owner: list[object | None] = [None] * n_buffers
        self._ready: list[torch.cuda.Event | None] = [None] * n_buffers  # free again once this has run
        self._staged_order: OrderedDict[int, None] = OrderedDict()  # staged buffers, oldest first
        self._lock = threading.Lock()
        self.staged = self.taken = self.reclaimed = self.skipped = 0

    def stage(self, packed) -> bool:
        """Copy `packed.flat` into a buffer (blocking this thread, not the GPU); False if it cannot be staged."""
        flat = packed.flat
        if flat is None or flat.dtype != self.buffers[0].dtype or flat.numel() > self.buffers[0].numel():
            self.skipped += 1
            return False
        with self._lock:
            i = self._pick()
            if i is None:
                self.skipped += 1
                return False
            self._state[i], self._owner[i] = _FILLING, packed
        buf = self.buffers[i]
        if self.cuda:
            with torch.cuda.stream(self.stream):
                buf[: flat.numel()].copy_(flat, non_blocking=True)  # pageable source: returns once copied
                done = torch.cuda.Event()
                done.record(self.stream)
            block = getattr(packed, "block", None)
            if block is not None:  # page-locked source: the block stays taken until the DMA ran
                block.record(self.stream)
        else:
            buf[: flat.numel()].copy_(flat)
            done = None
        with self._lock:
            self._state[i] = _STAGED
            self._staged_order[i] = None
            packed.staged = (i, done)
            self.staged += 1
        return True

    def take(self, packed) -> torch.Tensor | None:
        """The staged device copy of `packed` (the current stream waits for it), or None. Call `release` after
        enqueueing the reads of it."""
        with self._lock:
            st = getattr(packed, "staged", None)
            if st is None:
                return None
            i, done = st
            packed.staged = None
            if self._owner[i] is not packed or self._state[i] != _STAGED:
                return None
            self._state[i] = _TAKEN
            self._staged_order.pop(i, None)
            self.taken += 1
        if done is not None:
            torch.cuda.current_stream(self.device).wait_event(done)
        return self.buffers[i]

    def release(self, buf: torch.Tensor) -> None:
        """`buf` may be refilled once the work enqueued so far on the current stream has run."""
        i = next(k for k, b in enumerate(self.buffers) if b is buf)
        ev = None
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
        with self._lock:
            self._state[i], self._owner[i], self._ready[i] = _FREE, None, ev

    def _pick(self) -> int | None:
        for i, st in enumerate(self._state):
            if st == _FREE and (self._ready[i] is None or self._ready[i].query()):
                return i
        if self._staged_order:  # all busy: reclaim the buffer staged longest ago
            i, _ = self._staged_order.popitem(last=False)
            old = self._owner[i]
            if old is not None:
                old.staged = None
            self.reclaimed += 1
            return i
        return None

    def stats(self) -> dict:
        return {"staged": self.staged, "taken": self.taken, "reclaimed": self.reclaimed, "skipped": self.skipped}
