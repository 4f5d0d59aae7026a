"""Offline continuous-batching scheduler with adapter-aware admission (vLLM-V1-like token budget).

Each `schedule()` builds one step:
1. running sequences first (they hold KV): decodes (one pending token), then unfinished prefill chunks;
   a sequence that cannot get a KV block for its tokens preempts the most recently admitted running sequence
   not yet in this step (its KV is freed; it goes back to the front of its queue and is recomputed later);
2. then waiting sequences are admitted (prefill, chunked to the token budget) unless someone was preempted.
   Admission is grouped by adapter to minimise slot swaps: adapters pinned by running sequences (and the
   base model) first, then adapters resident in a slot, then loads chosen so that free seats and free slots
   run out together (`admission.LoadPicker`: slots stay pinned until an adapter's last request finishes).
   A request whose adapter cannot get a slot (all `max_loras` slots pinned) is deferred, not a barrier:
   requests of other, resident adapters go ahead. A request deferred past `defer_limit` admissions drains the
   slots (only its adapter and base requests are admitted until it gets a slot), so nothing waits forever and
   an in-order writer only ever buffers a bounded number of results.
   With the prefix cache on, each adapter's queue is in prefix order (engine/prefix_order.py), a sequence starts
   from the cached blocks of its prefix (engine/block_manager.py), and one whose prefix another running sequence
   is computing right now waits for it rather than computing it twice.
Every running sequence pins its adapter's slot, so a step never holds more than `max_loras` adapters.
A request with n > 1 samples runs as one sequence until its prompt is computed, then forks (engine/fork.py);
it holds seats for its forks from admission on, so `max_num_seqs` counts every sample.
By default a step mixes decodes and prefill chunks; `mix_prefill_decode=False` gives nano-vllm-style steps
that are all prefill or all decode, `chunked_prefill=False` feeds each prompt whole (one may exceed the budget).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq

from multilora_cli.config import EngineConfig
from multilora_cli.engine.admission import Admission
from multilora_cli.engine.batch import ScheduledBatch, StepPlan
from multilora_cli.engine.block_manager import BlockManager
from multilora_cli.engine.fork import Forking
from multilora_cli.engine.sequence import SeqStatus, Sequence
from multilora_cli.engine.slots import SlotManager
from multilora_cli.engine.token_bound import PROMPT_TOO_LONG_HINT
from multilora_cli.engine.waiting import WaitingQueues
from multilora_cli.errors import EngineError, MultiloraError, RequestError

POLICIES = ("group", "fifo")


class Scheduler(Admission, Forking):
    """Decides which sequences run each step; owns the waiting queues and the running list."""

    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        slots: SlotManager,
        *,
        max_model_len: int | None = None,
        policy: str = "group",
        chunked_prefill: bool = True,
        mix_prefill_decode: bool = True,
        waiting_window: int | None = None,
        defer_limit: int | None = None,
        private_prompts_upto: int | None = None,
    ):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = max_model_len if max_model_len is not None else config.max_model_len
        self.bm = block_manager
        self.slots = slots
        self.policy = policy
        self.chunked_prefill = chunked_prefill
        self.mix_prefill_decode = mix_prefill_decode
        self.waiting_window = waiting_window or 4 * config.max_num_seqs
        self.defer_limit = defer_limit or 2 * self.waiting_window
        # Keep a few blocks free when admitting next to running sequences, so admissions do not force
        # the very next decode step to preempt.
        self.watermark_blocks = max(1, block_manager.num_blocks // 100)
        self._waiting = WaitingQueues(prefix_block=block_manager.block_size if config.prefix_cache else None)
        # prefix cache: sequences computing a prompt, by (adapter identity, first block's tokens): a waiting
        # sequence that shares more of it waits for those blocks instead of computing them again (admission.py)
        self._computing: dict[tuple, list[Sequence]] = {}
        self.running: list[Sequence] = []  # admission order (forks right after their request's admission)
        self._reserved = 0  # seats held for forks of running sequences (engine/fork.py)
        # LongRoPE (engine/long_rope.py): a sequence whose prompt has at most this many tokens rewrites its first
        # blocks in place when it passes the limit, so its forks must not share them (None: forks always share)
        self.private_prompts_upto = private_prompts_upto
        self._finished: list[Sequence] = []
        self._admissions = 0
        self._pending: list[ScheduledBatch] = []  # scheduled, not yet postprocessed (2 with `schedule_ahead`)
        self._upcoming: tuple[tuple, int, list[str]] = ((), 0, [])  # (state key, slot loads, prefetch order) memo
        self._hurried: list[str] | None = None  # the prefetch order whose identities were last hurried
        self._pending_ids: dict = {}  # adapter -> its PendingIdentity while hashed (`Admission._note_identity`)
        self.num_steps = 0
        self.num_prefill_steps = 0  # steps with at least one prefill chunk
        self.num_decode_steps = 0  # steps of decodes only
        self.num_preemptions = 0
        self.num_ahead_steps = 0  # decode steps planned by `schedule_ahead`
        self.num_forks = 0  # requests with n > 1 whose samples forked

    # --- feeding ---------------------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def wants_more(self) -> bool:
        """True while the waiting window has room: feed requests lazily until this turns False."""
        return len(self._waiting) < self.waiting_window

    def has_unfinished(self) -> bool:
        return len(self._waiting) > 0 or bool(self.running)

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence. One that can never run fails at once (see `pop_finished`)."""
        n = seq.num_tokens
        limit = self.max_model_len
        if limit is not None and n >= limit + seq.prefill_only:  # (a scoring prompt may fill max_model_len)
            return self._fail(
                seq,
                RequestError(
                    f"request {seq.request.id}: prompt has {n} tokens but max_model_len is {limit}",
                    code="prompt_too_long",
                    hint=PROMPT_TOO_LONG_HINT,
                ),
            )
        need_tokens = n if seq.prefill_only else n + seq.sampling.max_tokens - seq.num_completion_tokens
        if limit is not None:
            need_tokens = min(need_tokens, limit)
        # with a sliding window a sequence holds only the window's blocks plus a chunk's (BlockManager.slide); a
        # LongRoPE model keeps a short prompt's first blocks to its switch, so it is held to the whole length
        chunk = need_tokens
        if self.chunked_prefill and self.private_prompts_upto is None:
            chunk = self.max_num_batched_tokens
        need = self.bm.blocks_at_once(need_tokens, chunk)
        if need > self.bm.num_blocks:
            return self._fail(
                seq,
                EngineError(
                    f"request {seq.request.id}: needs {need} KV blocks ({need_tokens} tokens) but the whole cache "
                    f"holds {self.bm.num_blocks} blocks of {self.bm.block_size}",
                    hint="lower max_tokens, or give the KV cache more memory",
                ),
            )
        seq.status = SeqStatus.WAITING
        seq.enqueued_at = self._admissions
        self._waiting.push(seq)
        if seq.prefix_id is not None and seq.adapter is not None:
            self._note_identity(seq)

    def pop_finished(self) -> list[Sequence]:
        """Sequences finished (finish_reason) or failed (error) since the last call."""
        out, self._finished = self._finished, []
        return out

    # --- one step --------------------------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch | None:
        """Plan the next step. None when there is nothing to run right now (e.g. the last sequences failed);
        keep calling while `has_unfinished()`. Call `postprocess` with the batch before the next `schedule`."""
        if self._pending:
            raise RuntimeError("schedule() called twice without postprocess()")
        plan = StepPlan(self.max_num_batched_tokens)
        if self.mix_prefill_decode:
            if self._schedule_running(plan, decodes=True):  # False: no prefill chunk is running (steady decode)
                self._schedule_running(plan, decodes=False)
            self._admit(plan)
        else:  # prefill-only step when there is prefill work that fits, else a decode-only step
            self._schedule_running(plan, decodes=False)
            self._admit(plan)
            if not plan.seqs:
                self._schedule_running(plan, decodes=True)
        if self.slots.prefetching and len(self._waiting):  # read the next adapters while this step runs
            order = self._prefetch_order()
            self.slots.prefetch(order)
            if order is not self._hurried:  # and hash their identities next (engine/identities.py)
                self._hurried = order
                self._hurry_identities(order)
        if not plan.seqs:
            return None
        batch = plan.to_batch(self.bm.block_size)
        self._pending.append(batch)
        self.num_steps += 1
        if batch.is_decode_only:
            self.num_decode_steps += 1
        else:
            self.num_prefill_steps += 1
        return batch

    def oldest_pending(self) -> ScheduledBatch | None:
        """The scheduled step `postprocess` expects next (None when none is pending)."""
        return self._pending[0] if self._pending else None

    def schedule_ahead(self, batch: ScheduledBatch, more_requests: bool = False) -> ScheduledBatch | None:
        """The step after `batch` (scheduled, its tokens not yet known), planned before `postprocess(batch)` so
        it can be launched while `batch` still runs: the same sequences, one decode each, fed the token `batch`
        samples (`ahead`: the runner takes it from the device). None unless that is the step `schedule()`
        would plan after `batch` if no sequence hits eos or a stop string: `batch` is all decodes, holds every
        running sequence, none of them reaches max_tokens / max_model_len with its token, no waiting request
        (nor one the caller feeds before the next `schedule()`: `more_requests`) could take a free seat, and
        every next token's KV fits without preemption. A sequence that does stop at
        `batch` is fed one token too many here; `postprocess` drops it (its KV write lands in blocks freed at
        the stop, before any later step can reuse them, as steps run in order on the device)."""
        if self._pending != [batch] or not batch.is_decode_only or not all(batch.sample):
            return None
        running = self.running
        if len(running) != batch.num_seqs or (
            (len(self._waiting) or more_requests) and self.num_seats < self.max_num_seqs
        ):
            return None
        limit = self.max_model_len
        for seq in batch.seqs:
            if seq.num_completion_tokens + 1 >= seq.sampling.max_tokens or seq.pending_forks:
                return None  # (pending forks: its samples fork at `batch` and join the next step)
            if limit is not None and len(seq.token_ids) + 1 >= limit:
                return None
        bm, size = self.bm, self.bm.block_size
        start = [s + 1 for s in batch.start]  # N's token sits at index start: fed now, its KV at that position
        window = bm.window is not None
        for seq, st in zip(batch.seqs, start):
            if window:
                self._slide(seq, st)
            if st + 1 > len(seq.block_table) * size and not bm.try_allocate(seq, st + 1):
                return None  # the next schedule() decides who is preempted
        ahead = ScheduledBatch(
            seqs=list(batch.seqs),
            num_new_tokens=[1] * batch.num_seqs,
            start=start,
            slots=list(batch.slots),
            sample=[True] * batch.num_seqs,
            num_decodes=batch.num_seqs,
            block_size=size,
            ahead=True,
        )
        self._pending.append(ahead)
        self.num_steps += 1
        self.num_decode_steps += 1
        self.num_ahead_steps += 1
        return ahead

    def preload(self, limit: int) -> int:
        """While a step runs: load up to `limit` of the next admissions' adapters that are read already into a
        free slot (or one whose adapter has no queued work), so the admission finds them resident instead of
        loading them between steps (`SlotManager.preload`)."""
        if not len(self._waiting):
            return 0
        return self.slots.preload(self._prefetch_order(), keep=self._waiting, limit=limit)

    def _prefetch_order(self) -> list[str]:
        """`upcoming_adapters`, recomputed only when queues, seats or slots moved: in steady decode it would be
        the same list every step (0.2-0.4 ms of Python per step in the 64- and 256-adapter bench rows). At most
        `read_ahead` (one wave of seats) long, not the pool's size: with 1,000 slots and adapters of a request
        or two, the key moves every step and 1,000 replayed picks a step would grow with the pool."""
        slots = self.slots
        key = (self._waiting.version, len(self.running), slots.num_pinned)
        memo_key, loads, order = self._upcoming
        if key != memo_key:
            self._upcoming = (key, slots.loads, self.upcoming_adapters(slots.read_ahead))
        elif loads != slots.loads:  # only loads since (preloads, mostly: one or two a step): drop what is in a slot
            # now rather than replay the picks (~1 ms at 1,000 adapters, each step that preloads)
            self._upcoming = (key, slots.loads, [a for a in order if not slots.is_resident(a)])
        return self._upcoming[2]

    def postprocess(
        self, batch: ScheduledBatch, sampled_token_ids: Seq[int], stop: Callable[[Sequence], str | None]
    ) -> None:
        """Record the step: advance computed tokens, append one sampled id per `batch.sampled_seqs()` (in
        order), fork the other samples of a request with n > 1 at its first token, and finish sequences for
        which `stop(seq)` returns a finish reason."""
        if not self._pending or batch is not self._pending[0]:
            raise RuntimeError("postprocess() got a batch that is not the oldest pending one")
        self._pending.pop(0)
        ids = list(sampled_token_ids)
        if len(ids) != batch.num_sampled:
            raise ValueError(f"expected {batch.num_sampled} sampled ids, got {len(ids)}")
        it = iter(ids)
        any_done = False
        bs = self.bm.block_size
        for seq, n, smp in zip(batch.seqs, batch.num_new_tokens, batch.sample):
            if seq.status is not SeqStatus.RUNNING:
                # stopped at the step before this `ahead` one, or failed before this postprocess (an adapter its
                # slot load found broken: Engine._verify): drop its token, if it sampled one (a prompt chunk or a
                # scored prompt did not)
                if smp:
                    next(it)
                continue
            seq.num_computed_tokens += n
            if seq.prefix_id is not None and seq.num_computed_tokens // bs > len(seq.cache_nodes):
                self.bm.register(seq)  # a block filled: later sequences with this prefix may start from it
            if not smp:
                if seq.prefill_only and seq.num_computed_tokens == len(seq.token_ids):  # scored: done
                    self._finish(seq, reason="length")
                    any_done = True
                continue
            seq.token_ids.append(int(next(it)))  # Sequence.append_token, inline: once per sequence a step
            if seq.pending_forks:  # before the stop check: a sample that stops at once still leaves its prompt
                self._fork(seq)
            reason = stop(seq)
            if reason is not None:
                self._finish(seq, reason=reason)
                any_done = True
        if any_done:
            self.running = [s for s in self.running if s.status is SeqStatus.RUNNING]

    # --- running sequences -----------------------------------------------------------------------------------
    def _schedule_running(self, plan: StepPlan, decodes: bool) -> bool:
        """Add the running decodes (or prefill chunks) that fit. Returns False when every running sequence was
        visited and none was of the other kind: the other pass would then walk the whole list to add nothing."""
        running, ids, bm = self.running, plan.ids, self.bm
        block_size = bm.block_size
        window = bm.window is not None
        other = False
        i = 0
        while i < len(running) and plan.budget > 0:
            seq = running[i]
            pending = len(seq.token_ids) - seq.num_computed_tokens
            if (pending == 1) != decodes:
                other = True
                i += 1
                continue
            if seq.seq_id in ids:
                i += 1
                continue
            if decodes:
                n = 1  # pending is 1 and the budget positive: what both rules below give, without their lookups
            elif self.chunked_prefill:
                n = min(pending, plan.budget)
            elif pending <= plan.budget or plan.num_prefills == 0:
                n = pending
            else:
                i += 1
                continue
            if window:
                self._slide(seq, seq.num_computed_tokens)
            target = seq.num_computed_tokens + n
            # most steps a sequence's last block has room (a decode needs a block every block_size tokens)
            if target > len(seq.block_table) * block_size and not bm.try_allocate(seq, target):
                while not bm.can_allocate(seq, target):
                    victim = self._victim(plan, seq)
                    if victim is None:
                        break
                    self._preempt(victim, plan)
                i = running.index(seq)  # victims may have sat before `seq` in the list
                if not bm.try_allocate(seq, target):
                    if plan.seqs:  # others in this step hold the blocks: recompute this one later
                        self._preempt(seq, plan)
                    else:  # alone with the whole cache and still short (add() should have caught it)
                        self._fail(
                            seq,
                            EngineError(
                                f"request {seq.request.id}: {target} tokens do not fit in the KV cache "
                                f"({bm.num_blocks} blocks of {bm.block_size})",
                                hint="lower max_tokens, or give the KV cache more memory",
                            ),
                        )
                        running.remove(seq)
                    continue
            plan.add(seq, n)
            i += 1
        return other or i < len(running)

    def _slide(self, seq: Sequence, first_query: int) -> None:
        """Sliding window: drop `seq`'s KV blocks that no query from position `first_query` on reads
        (BlockManager.slide), nor any query of its pending forks, nor a LongRoPE recompute."""
        if seq.pending_forks:  # its forks query from the prompt's last full block on, over the blocks it shares
            first_query = min(first_query, (seq.num_prompt_tokens - 1) // self.bm.block_size * self.bm.block_size)
        limit = self.private_prompts_upto
        if limit is not None and seq.num_prompt_tokens <= limit and first_query <= limit:
            return  # LongRoPE: positions 0 .. limit - 1 are recomputed in place at the switch (engine/long_rope.py)
        self.bm.slide(seq, first_query)

    def _victim(self, plan: StepPlan, keep: Sequence) -> Sequence | None:
        """Most recently admitted running sequence that is not in this step yet (and not `keep`)."""
        for seq in reversed(self.running):
            if seq is not keep and seq.seq_id not in plan.ids:
                return seq
        return None

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        self.bm.free(seq)
        self.slots.release(seq.adapter)
        self._drop_seats(seq)
        self.running.remove(seq)
        seq.num_computed_tokens = 0
        seq.slot = -1
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        seq.enqueued_at = self._admissions
        self.num_preemptions += 1
        self._waiting.push(seq, front=True)
        plan.preempted.append(seq)

    # --- endings ---------------------------------------------------------------------------------------------
    def _fail_queue(self, adapter: str | None) -> None:
        """The adapter cannot be loaded: fail every waiting sequence that needs it with the same error."""
        queued = self._waiting.take_all(adapter)
        for seq in queued:
            self._fail(seq, queued[0].error)

    def fail_adapter(self, adapter: str, error: MultiloraError) -> int:
        """Fail every running and waiting sequence of `adapter` with `error` (the engine: its slot load found a
        NaN / Inf after they were admitted; a step still in flight drops their tokens, as for any finished
        sequence). Returns how many."""
        n = 0
        for seq in self.running:
            if seq.adapter == adapter and seq.status is SeqStatus.RUNNING:
                self._fail(seq, error)
                n += 1
        if n:
            self.running = [s for s in self.running if s.status is SeqStatus.RUNNING]
        if adapter in self._waiting:
            for seq in self._waiting.take_all(adapter):
                self._fail(seq, error)
                n += 1
        return n

    def _fail(self, seq: Sequence, error: MultiloraError) -> None:
        seq.error = error
        self._finish(seq, reason=None)

    def _finish(self, seq: Sequence, reason: str | None) -> None:
        if seq.status is SeqStatus.RUNNING:
            self.slots.release(seq.adapter)
            self._drop_seats(seq)
        self.bm.free(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        seq.slot = -1
        self._finished.append(seq)
