"""`WaitingQueues`: the scheduler's waiting room, one FIFO queue per adapter.

Grouping by adapter is what lets admission run an adapter's requests together (fewer slot swaps) and defer
one adapter without blocking the others. Preempted sequences re-enter at the front of their adapter's queue.
With `prefix_block` set (the prefix cache is on) each queue is in prefix order (engine/prefix_order.py), else in
arrival order.
"""

from __future__ import annotations

from collections import deque

from multilora_cli.engine.prefix_order import PrefixQueue
from multilora_cli.engine.sequence import Sequence
from multilora_cli.engine.slots import SlotManager


class WaitingQueues:
    """Waiting sequences by adapter (None = base). Empty queues are dropped as soon as they empty."""

    def __init__(self, prefix_block: int | None = None):
        self._prefix_block = prefix_block  # block size the queues group prefixes by; None: arrival order
        self._q: dict[str | None, deque[Sequence] | PrefixQueue] = {}
        self._seats: dict[str | None, int] = {}  # per queue: seats its sequences take (n > 1 counts n)
        self._n = 0
        self.version = 0  # bumped by every push / pop: callers memoise on it
        # at most the `enqueued_at` of every waiting sequence (a push lowers it, a pop leaves it: still a bound),
        # so admission skips `oldest()`, a walk of every queue head (~1,000 at 1,000 adapters), while nothing can
        # have waited past its limit
        self.floor = 0

    def __len__(self) -> int:
        return self._n

    def __contains__(self, adapter: object) -> bool:
        """Whether `adapter` has queued work (so `SlotManager.acquire(keep=...)` can spare it)."""
        return adapter in self._q

    def push(self, seq: Sequence, front: bool = False) -> None:
        q = self._q.get(seq.adapter)
        if q is None:
            q = self._q[seq.adapter] = deque() if self._prefix_block is None else PrefixQueue(self._prefix_block)
        self._seats[seq.adapter] = self._seats.get(seq.adapter, 0) + 1 + seq.pending_forks
        if front:
            q.appendleft(seq)
        else:
            q.append(seq)
        self.floor = seq.enqueued_at if not self._n else min(self.floor, seq.enqueued_at)
        self._n += 1
        self.version += 1

    def adapters(self) -> list[str | None]:
        return list(self._q)

    def size(self, adapter: str | None) -> int:
        """Seats the queue's sequences take once admitted: one each, n for a request with n samples."""
        return self._seats[adapter]

    def head(self, adapter: str | None) -> Sequence:
        return self._q[adapter][0]

    def pop(self, adapter: str | None) -> Sequence:
        q = self._q[adapter]
        seq = q.popleft()
        self._seats[adapter] -= 1 + seq.pending_forks
        if not q:
            del self._q[adapter]
            del self._seats[adapter]
        self._n -= 1
        self.version += 1
        return seq

    def take_all(self, adapter: str | None) -> list[Sequence]:
        q = self._q.pop(adapter)
        del self._seats[adapter]
        self._n -= len(q)
        self.version += 1
        return list(q)

    def oldest(self) -> Sequence | None:
        """The queue head that has waited longest (smallest `enqueued_at`)."""
        return min((q[0] for q in self._q.values()), key=lambda s: s.enqueued_at, default=None)

    def refresh_floor(self) -> None:
        """`floor` made exact again (a walk of every waiting sequence): pops leave it ever lower than needed."""
        self.floor = min((s.enqueued_at for q in self._q.values() for s in q), default=0)

    def group_key(self, adapter: str | None, slots: SlotManager) -> tuple:
        """Admission order of the queues that need no load (base or in a slot; loads are ordered by
        `admission.LoadPicker`): no swap needed (base, or pinned by running sequences), then resident in a slot
        (a hit); within a tier the adapter with the most queued requests, then the oldest."""
        tier = 0 if adapter is None or slots.is_pinned(adapter) else 1
        q = self._q[adapter]
        return (tier, -len(q), q[0].seq_id)
