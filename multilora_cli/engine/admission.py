"""Admission of waiting sequences into a step: the adapter-aware half of the scheduler (engine/scheduler.py).

Grouped policy: adapters pinned by running sequences (and the base model) first, then adapters resident in a
slot, then the adapter with the most waiting requests (`WaitingQueues.group_key`). A request whose adapter
cannot get a slot is deferred, not a barrier; one deferred past `defer_limit` admissions drains the slots.
`fifo` is the baseline: strict arrival order across adapters. Mixed into `Scheduler`, whose state it uses.
"""

from __future__ import annotations

import heapq

from multilora_cli.engine.batch import StepPlan
from multilora_cli.engine.sequence import SeqStatus, Sequence
from multilora_cli.errors import MultiloraError

_OK, _NO_SLOT, _FAILED, _STOP = range(4)


class Admission:
    """`_admit(plan)` and the adapter order prefetching follows (`upcoming_adapters`)."""

    def upcoming_adapters(self, k: int) -> list[str]:
        """Up to k adapters with queued requests that are not in a slot, in the order admission would load
        them (prefetch candidates)."""
        w = self._waiting
        cands = [a for a in w.adapters() if a is not None and not self.slots.is_resident(a)]
        if self.policy == "group":
            cands.sort(key=lambda a: w.group_key(a, self.slots))
        else:
            cands.sort(key=lambda a: w.head(a).seq_id)
        return cands[:k]

    def _admit(self, plan: StepPlan) -> None:
        w = self._waiting
        if plan.preempted or not len(w):
            return  # the cache is short: admitting now would only preempt again
        adapters = w.adapters()
        oldest = w.oldest()
        if oldest.adapter is not None and self._admissions - oldest.enqueued_at > self.defer_limit:
            # deferred too long: drain, only its adapter (and base, which needs no slot) may start
            adapters = [a for a in adapters if a == oldest.adapter or a is None]
        if self.policy == "group":
            adapters.sort(key=lambda a: w.group_key(a, self.slots))
            for a in adapters:
                if self._admit_queue(plan, a) == _STOP:
                    break
        else:
            self._admit_fifo(plan, adapters)

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
        if len(self.running) >= self.max_num_seqs or plan.budget <= 0:
            return _STOP
        pending = seq.num_uncomputed_tokens
        if self.chunked_prefill:
            n = min(pending, plan.budget)
        elif pending <= plan.budget or plan.num_prefills == 0:
            n = pending  # whole prompt; may exceed the budget when it is the step's only prefill
        else:
            return _STOP
        reserve = self.watermark_blocks if self.running else 0
        if not self.bm.can_allocate(seq, n, reserve):
            return _STOP
        try:
            # spare adapters with queued work; block on a load only when nothing else could run this step
            slot = self.slots.acquire(seq.adapter, keep=self._waiting, wait=not self.running)
        except MultiloraError as e:
            seq.error = e
            return _FAILED
        if slot is None:
            return _NO_SLOT
        self.bm.allocate(seq, n)  # cannot fail: checked above
        self.slots.retain(seq.adapter)
        seq.slot = slot
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        self._admissions += 1
        plan.add(seq, n)
        return _OK
