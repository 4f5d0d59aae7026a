"""Admission of waiting sequences into a step: the adapter-aware half of the scheduler (engine/scheduler.py).

Grouped policy: adapters pinned by running sequences (and the base model) first, then adapters resident in a
slot (`WaitingQueues.group_key`), then adapters to load, picked by `LoadPicker` so that the free seats and the
free slots run out together. A request whose adapter cannot get a slot is deferred, not a barrier; one deferred
past `defer_limit` admissions goes first, and drains the slots while it has none. `fifo` is the baseline: strict arrival order across adapters.
Mixed into `Scheduler`, whose state it uses.

Why the load order matters: a slot stays pinned until the last request of its adapter finishes, so with requests
of equal length seats and slots turn over in waves. Loading the most-queued adapters first (the old order) leaves
the last waves with many adapters of one or two requests each: all slots pinned, seats idle, and a fifth wave for
the leftovers (CPU simulation, 1024 requests of 128 + 128 tokens, 256 adapters, 64 slots, 256 seats: 642 steps
against 516 for 64 adapters; with `LoadPicker`: 516).
"""

from __future__ import annotations

import heapq

from multilora_cli.engine.batch import StepPlan
from multilora_cli.engine.identities import PendingIdentity
from multilora_cli.engine.sequence import SeqStatus, Sequence
from multilora_cli.errors import MultiloraError

_OK, _NO_SLOT, _FAILED, _STOP, _WAIT = range(5)  # _WAIT: its prefix is being computed (deferred, like _NO_SLOT)


class LoadPicker:
    """Chooses which adapter to load next from `sizes` (adapter -> queued requests, in tie-break order).

    Each pick takes the adapter whose queue is closest to free seats / free slots, so a wave fills its seats
    with exactly its slots and keeps a mix of small and large queues for the later waves. When the pool is
    clearly richer than seats per slot (slots to spare overall), the target is the pool's mean instead, so the
    large queues are not all left for the end, where they would overflow the last wave. With three slots or
    fewer left, a queue that leaves the remaining seats exactly fillable by the remaining slots is preferred.
    Adapters are bucketed by queue size, so a pick costs the number of distinct sizes, not of adapters (the
    scheduler asks for up to `SlotManager.read_ahead` picks a step to order prefetches).
    """

    def __init__(self, sizes: dict, seats_per_slot: float):
        self._by_size: dict[int, list] = {}
        for a, q in sizes.items():
            self._by_size.setdefault(q, []).append(a)
        for names in self._by_size.values():
            names.reverse()  # pop() from the end hands out the caller's first
        self._n = len(sizes)
        self._total = sum(sizes.values())
        self._rich = 1.1 * seats_per_slot

    def __len__(self) -> int:
        return self._n

    def pick(self, free_seqs: int, free_slots: int):
        """Remove and return the next adapter to load (None when the pool is empty or nothing is free)."""
        if not self._n or free_seqs <= 0 or free_slots <= 0:
            return None
        target = free_seqs / free_slots
        mean = self._total / self._n
        if mean > self._rich:
            target = max(target, mean)
        exact = free_slots <= 3

        def key(q):
            fits = exact and q <= free_seqs and self._fillable(free_seqs - q, free_slots - 1, q)
            return (exact and not fits, abs(q - target), -q)

        q = min(self._by_size, key=key)
        names = self._by_size[q]
        a = names.pop()
        if not names:
            del self._by_size[q]
        self._n -= 1
        self._total -= q
        return a

    def _fillable(self, seats: int, slots: int, taken: int) -> bool:
        """Whether at most `slots` (<= 2) other queues sum to exactly `seats` (one of size `taken` is spoken for)."""
        by = self._by_size

        def have(q: int, n: int = 1) -> bool:
            return len(by.get(q, ())) - (q == taken) >= n

        if seats == 0:
            return True
        if slots >= 1 and have(seats):
            return True
        return slots >= 2 and any(have(q) and have(seats - q, 1 + (seats - q == q)) for q in by if 0 < q < seats)


class Admission:
    """`_admit(plan)` and the adapter order prefetching follows (`upcoming_adapters`)."""

    def upcoming_adapters(self, k: int) -> list[str]:
        """Up to k adapters with queued requests that are not in a slot, in the order admission would load
        them (prefetch candidates)."""
        w = self._waiting
        cands = [a for a in w.adapters() if a is not None and not self.slots.is_resident(a)]
        if self.policy != "group":
            cands.sort(key=lambda a: w.head(a).seq_id)
            return cands[:k]
        # replay the picks admission would make, assuming each load fills its queue and a new wave of seats
        # and slots opens when this one is used up
        picker = self._picker(cands)
        # admission serves base and in-slot queues before any load: their requests take seats first, and the
        # in-slot adapters that are not pinned yet will pin their slots
        cheap = [a for a in w.adapters() if a is None or self.slots.is_resident(a)]
        seats = self.max_num_seqs - self.num_seats - sum(w.size(a) for a in cheap)
        slots = (
            self.slots.max_loras
            - self.slots.num_pinned
            - sum(1 for a in cheap if a is not None and not self.slots.is_pinned(a))
        )
        out = []
        while len(out) < k and len(picker):
            if seats <= 0 or slots <= 0:
                seats, slots = self.max_num_seqs, self.slots.max_loras
            a = picker.pick(seats, slots)
            out.append(a)
            seats -= w.size(a)
            slots -= 1
        return out

    def _note_identity(self, seq: Sequence) -> None:
        """A queued sequence whose adapter's identity is still being hashed (engine/identities.py): kept by adapter
        for `_hurry_identities` (one per adapter: its sequences share it)."""
        if isinstance(seq.prefix_id, PendingIdentity) and not seq.prefix_id.done():
            self._pending_ids.setdefault(seq.adapter, seq.prefix_id)

    def _hurry_identities(self, order: list[str]) -> None:
        """Move the prefix-cache identities of `order`'s adapters (the next loads, in admission order) to the
        front of their hash queue: fed in request order, they were hashed on the step loop at admission
        (engine/identities.py). Dict lookups only: a walk of the queue heads cost more than it saved."""
        pend = self._pending_ids
        if not pend:
            return
        hurry = []
        for a in order:
            p = pend.get(a)
            if p is None:
                continue
            if p.done():
                del pend[a]
            else:
                hurry.append(p)
        if hurry:
            PendingIdentity.hurry(hurry)

    def _picker(self, loads: list) -> LoadPicker:
        w = self._waiting
        loads = sorted(loads, key=lambda a: w.head(a).seq_id)  # ties go to the longest-waiting queue
        return LoadPicker({a: w.size(a) for a in loads}, self.max_num_seqs / self.slots.max_loras)

    def _admit(self, plan: StepPlan) -> None:
        w = self._waiting
        if plan.preempted or not len(w):
            return  # the cache is short: admitting now would only preempt again
        if self.num_seats >= self.max_num_seqs or plan.budget <= 0:
            return  # no seat or token budget: skip the ordering work (steady decode with a queue)
        # (`w.floor` <= every waiting sequence's enqueued_at: within the limit, no queue head can be past it)
        oldest = None
        if self._admissions - w.floor > self.defer_limit:
            oldest = w.oldest()
            if self._admissions - oldest.enqueued_at <= self.defer_limit:
                w.refresh_floor()  # the bound was stale: made exact, later admissions skip the walk again
        if (
            oldest is not None
            and oldest.adapter is not None
            and self._admissions - oldest.enqueued_at > self.defer_limit
        ):
            # deferred too long: its queue goes first. Once it is in, the others fill the seats left (draining
            # them too would idle seats while slots are free); while it has no slot, drain: only its adapter and
            # base (which needs no slot) may start, so the next slot that frees is its
            if self._admit_queue(plan, oldest.adapter) == _STOP:
                return
            if oldest.adapter in w:
                adapters = [a for a in w.adapters() if a is None]
                return self._admit_fifo(plan, adapters) if self.policy != "group" else self._admit_group(plan, adapters)
        adapters = w.adapters()
        if self.policy != "group":
            return self._admit_fifo(plan, adapters)
        self._admit_group(plan, adapters)

    def _admit_group(self, plan: StepPlan, adapters: list[str | None]) -> None:
        w = self._waiting
        loads = [a for a in adapters if not self.slots.is_resident(a)]
        cheap = [a for a in adapters if self.slots.is_resident(a)]  # base, pinned or resident: no load
        cheap.sort(key=lambda a: w.group_key(a, self.slots))
        for a in cheap:
            if self._admit_queue(plan, a) == _STOP:
                return
        picker = self._picker(loads)
        while len(picker):
            a = picker.pick(self.max_num_seqs - self.num_seats, self.slots.max_loras - self.slots.num_pinned)
            if a is None or self._admit_queue(plan, a) == _STOP:  # None: no seat or slot left
                return

    def _admit_queue(self, plan: StepPlan, adapter: str | None) -> int:
        w = self._waiting
        while adapter in w:
            r = self._try_admit(plan, w.head(adapter))
            if r == _OK:
                w.pop(adapter)
            else:
                if r == _FAILED:
                    self._fail_queue(adapter)
                return r
        return _OK

    def _admit_fifo(self, plan: StepPlan, adapters: list[str | None]) -> None:
        """Baseline policy: strict arrival order across adapters (still defers what does not get a slot)."""
        w = self._waiting
        heap = [(w.head(a).seq_id, i, a) for i, a in enumerate(adapters)]
        heapq.heapify(heap)
        while heap:
            _, i, a = heapq.heappop(heap)
            r = self._try_admit(plan, w.head(a))
            if r == _OK:
                w.pop(a)
                if a in w:
                    heapq.heappush(heap, (w.head(a).seq_id, i, a))
            elif r == _FAILED:
                self._fail_queue(a)
            elif r == _STOP:
                return

    def _try_admit(self, plan: StepPlan, seq: Sequence) -> int:
        seats = self.seats_for(seq)  # 1, or n with the seats its samples take once they fork (engine/fork.py)
        if self.num_seats + seats > self.max_num_seqs or plan.budget <= 0:
            return _STOP
        bm = self.bm
        if isinstance(seq.prefix_id, PendingIdentity):  # its adapter's identity, hashed off this thread
            seq.prefix_id = seq.prefix_id.get()
        hits = bm.lookup(seq)  # cached full blocks of its prefix (prefix cache; [] when off or none)
        if self._prefix_in_flight(seq, len(hits)):
            return _WAIT
        done = len(hits) * bm.block_size
        pending = seq.num_uncomputed_tokens - done
        if self.chunked_prefill:
            n = min(pending, plan.budget)
        elif pending <= plan.budget or plan.num_prefills == 0:
            n = pending  # whole prompt; may exceed the budget when it is the step's only prefill
        else:
            return _STOP
        # beside running sequences, keep a few blocks free, and one per fork (its own partial prompt block)
        reserve = self.watermark_blocks + seats - 1 if self.running else 0
        if not bm.can_begin(seq, hits, done + n, reserve):
            return _STOP
        try:
            # spare adapters with queued work; block on a load only when nothing else could run this step
            slot = self.slots.acquire(seq.adapter, keep=self._waiting, wait=not self.running)
        except MultiloraError as e:
            seq.error = e
            return _FAILED
        if slot is None:
            return _NO_SLOT
        bm.begin(seq, hits)  # holds the hits: its first `done` tokens are computed
        if bm.window is not None:
            self._slide(seq, done)  # (hits wholly behind its window go back at once)
        bm.allocate(seq, done + n)  # cannot fail: checked above
        self.slots.retain(seq.adapter)
        seq.slot = slot
        seq.status = SeqStatus.RUNNING
        self._hold_seats(seq)
        self.running.append(seq)
        self._admissions += 1
        plan.add(seq, n)
        if seq.prefix_id is not None and done + bm.block_size < seq.num_prompt_tokens:  # full blocks to compute
            self._note_computing(seq)
        return _OK

    # --- prefix cache: do not compute a prefix twice at once -----------------------------------------------------
    def _prefix_key(self, seq: Sequence) -> tuple:
        return (seq.prefix_id, tuple(seq.token_ids[: self.bm.block_size]))

    def _note_computing(self, seq: Sequence) -> None:
        if len(self._computing) > 4 * self.max_num_seqs:  # drop entries of sequences past their prompts
            self._computing = {k: v for k, v in self._computing.items() if self._live(v)}
        self._computing.setdefault(self._prefix_key(seq), []).append(seq)

    @staticmethod
    def _live(seqs: list[Sequence]) -> list[Sequence]:
        """Those still running and computing their prompt (finished, preempted or past it: their blocks are
        registered or gone)."""
        seqs[:] = [s for s in seqs if s.status is SeqStatus.RUNNING and s.num_computed_tokens < s.num_prompt_tokens]
        return seqs

    def _prefix_in_flight(self, seq: Sequence, num_hits: int) -> bool:
        """Whether a running sequence of `seq`'s adapter identity is computing full blocks of `seq`'s prefix
        past its `num_hits` cached ones right now: `seq` then waits for them to be registered (a step or a few
        chunks), so a group of requests sharing a prefix computes it once, not once per request admitted at
        the same time."""
        if seq.prefix_id is None or not seq.may_take_hits:
            return False
        others = self._computing.get(self._prefix_key(seq))
        if not others or not self._live(others):
            return False
        bs, ids = self.bm.block_size, seq.token_ids
        limit = (len(ids) - 1) // bs  # blocks it could ever hit
        for o in others:
            common = num_hits
            oids = o.prompt_token_ids
            while common < limit and ids[common * bs : (common + 1) * bs] == oids[common * bs : (common + 1) * bs]:
                common += 1
            if common > num_hits and o.num_computed_tokens < common * bs:
                return True
        return False
