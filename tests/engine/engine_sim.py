"""A plain-Python stand-in for the model runner, so the scheduler runs its real loop in tests.

The "model" writes each fed token's (seq, position, token) into a paged KV store at the slot the batch names,
checks that every position a query attends to holds that sequence's right token (catching block-table,
slot-mapping and recompute bugs), and "samples" token = f(seed, completion position): a preempted and
recomputed sequence must therefore produce exactly the tokens it would have produced undisturbed. The samples of
a request with n > 1 may read KV that their sample 0 wrote, only in the prompt's full blocks they share with it.
With the prefix cache (sequences with `prefix_id` set), a sequence may read KV another wrote only if that writer
had the same adapter identity and the same tokens up to that position; no registered block is ever written.
With a sliding `window` W the model reads, for queries from position s on, positions s - W + 1 .. only, and those
must sit in blocks the sequence still holds (not dropped, engine/block_manager.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.batch import ScheduledBatch
from multilora_cli.engine.block_manager import BlockManager
from multilora_cli.engine.detokenizer import StopChecker
from multilora_cli.engine.prefix_cache import DEAD
from multilora_cli.engine.request import Request
from multilora_cli.engine.scheduler import Scheduler
from multilora_cli.engine.sequence import Sequence
from multilora_cli.engine.slots import SlotManager


def fake_token(seed: int, position: int) -> int:
    return 3 + (seed * 7919 + position * 104729) % 997


def expected_output(seq: Sequence) -> list[int]:
    return [fake_token(seq.seed, i) for i in range(seq.sampling.max_tokens)]


def make_seq(
    i: int, adapter: str | None, prompt_len: int, max_tokens: int, seq_id: int | None = None, **sp
) -> Sequence:
    """Request i's sequence (its seq_id i unless given: a request with n samples takes seq_id .. seq_id + n-1)."""
    req = Request(key=i, id=f"r{i}", adapter=adapter, sampling=SamplingParams(max_tokens=max_tokens, **sp))
    prompt = [1 + (i * 13 + j) % 50 for j in range(prompt_len)]
    return Sequence.from_request(i if seq_id is None else seq_id, req, prompt, engine_seed=1)


def shared_prefix(seq: Sequence, block_size: int) -> int:
    """Positions a forked sample may read from its sample 0's blocks: the prompt's full blocks before its last
    token (engine/fork.py), none for sample 0 itself."""
    return (seq.num_prompt_tokens - 1) // block_size * block_size if seq.sample_index else 0


@dataclass
class StepLog:
    batch: ScheduledBatch
    adapters: set
    running: int
    resident: dict
    decodes: list  # per sequence: fed exactly its last generated token


@dataclass
class Sim:
    config: EngineConfig
    num_blocks: int
    scheduler_kw: dict = field(default_factory=dict)
    fail_load: set = field(default_factory=set)
    prefetch_threads: int = 0
    gates: dict = field(default_factory=dict)  # adapter -> threading.Event its read waits for (slow disks)
    run_ahead: bool = False  # plan each next decode step before postprocess, as the engine does on a GPU
    window: int | None = None  # every layer's sliding window (BlockManager drops the blocks behind it)
    # called with each batch after it "ran" and before its postprocess (where the engine checks the slot loads'
    # device verdicts, Engine._verify)
    before_postprocess: object = None

    def __post_init__(self):
        self.bm = BlockManager(self.num_blocks, self.config.block_size, window=self.window)
        self.installed: dict[int, str] = {}

        def load_cpu(name):
            if name in self.gates:
                assert self.gates[name].wait(30), f"read of {name} never released"
            if name in self.fail_load:
                from multilora_cli.errors import AdapterError

                raise AdapterError(f"adapter {name!r}: cannot read weights")
            return {"name": name}

        def install(slot, name, obj):
            assert obj["name"] == name
            self.installed[slot] = name

        def evict(slot, name):
            assert self.installed.pop(slot) == name

        self.slots = SlotManager(
            self.config.max_loras,
            self.config.max_cpu_loras,
            load_cpu,
            install,
            evict,
            prefetch_threads=self.prefetch_threads,
            read_ahead=self.config.max_num_seqs,  # as the engine sets it
        )
        self.sched = Scheduler(self.config, self.bm, self.slots, **self.scheduler_kw)
        self.kv: dict[int, tuple[int, int, int]] = {}  # cache slot -> (seq_id, position, token)
        self.writer: dict[int, Sequence] = {}  # cache slot -> the sequence that wrote it
        self.log: list[StepLog] = []
        self.finished: list[Sequence] = []
        self.admitted_step: dict[int, int] = {}
        self.finished_step: dict[int, int] = {}
        self._ahead: ScheduledBatch | None = None

    def step(self, stop=None) -> ScheduledBatch | None:
        b, self._ahead = self._ahead, None
        if b is None:
            b = self.sched.schedule()
            if b is not None:
                self._run(b)
        if b is not None:
            ids = [fake_token(s.seed, s.sample_position) for s in b.sampled_seqs()]  # what the device samples
            if self.run_ahead:  # the next step runs (writes its KV) before b's ids reach the host
                self._ahead = self.sched.schedule_ahead(b)
                if self._ahead is not None:
                    self._run(self._ahead, fed=ids)
            stop = stop or StopChecker(max_model_len=self.sched.max_model_len)
            if self.before_postprocess is not None:
                self.before_postprocess(b)
            self.sched.postprocess(b, ids, stop)
        for s in self.sched.pop_finished():
            self.finished.append(s)
            self.finished_step[s.seq_id] = len(self.log)
        return b

    def _run(self, b: ScheduledBatch, fed: list[int] | None = None) -> None:
        """Check the batch like a model would use it, write its KV, log invariants. `fed`: an ahead batch's
        input ids (the previous step's samples, which only the device has yet)."""
        bs = b.block_size
        assert b.ahead == (fed is not None)
        ids, pos, slot_map = fed if b.ahead else b.input_ids(), b.positions(), b.kv_slot_mapping()
        assert len(ids) == len(pos) == len(slot_map) == b.num_tokens == b.query_start_loc()[-1]
        holders: dict[int, list[Sequence]] = {}
        for s in self.sched.running:
            assert all(blk < 0 for blk in s.block_table[: s.num_dropped]), s
            for blk in s.block_table[s.num_dropped :]:
                assert blk >= 0, s
                holders.setdefault(blk, []).append(s)
        for blk, seqs in holders.items():  # a block is shared by the samples of one request, or a cached prefix's
            assert self.bm.refcount(blk) == len(seqs), (blk, seqs)
            cached = self.bm.cache.node(blk) != DEAD and len({s.prefix_id for s in seqs}) == 1
            assert len({s.request.key for s in seqs}) == 1 or cached, f"block {blk} shared by {seqs}"
        assert len(holders) + self.bm.num_free_blocks == self.bm.num_blocks
        qs = b.query_start_loc()
        for i, seq in enumerate(b.seqs):
            self.admitted_step.setdefault(seq.seq_id, len(self.log))
            assert b.slots[i] == self.slots.slot_of(seq.adapter)
            if seq.adapter is not None:
                assert self.installed[b.slots[i]] == seq.adapter
            for t in range(qs[i], qs[i + 1]):  # never into a shared block, nor a registered (cached) one
                assert self.bm.refcount(slot_map[t] // bs) == 1, (seq, pos[t])
                assert self.bm.cache.node(slot_map[t] // bs) == DEAD, (seq, pos[t])
                self.kv[slot_map[t]] = (seq.seq_id, pos[t], ids[t])
                self.writer[slot_map[t]] = seq
            ctx = b.seq_lens()[i]
            shared = shared_prefix(seq, bs)
            first = seq.seq_id - seq.sample_index  # its sample 0
            lo = max(0, b.start[i] - self.window + 1) if self.window else 0  # the first query's window
            for p in range(lo, ctx):  # everything attended to is this sequence's own, correct KV (or its prompt's)
                assert p // bs >= seq.num_dropped, (seq, p)
                cs = seq.block_table[p // bs] * bs + p % bs
                tok = seq.token_ids[p] if p < seq.num_tokens else fed[i]  # (ahead: the fed token is not appended)
                got = self.kv.get(cs)
                if got == (seq.seq_id, p, tok) or (p < shared and got == (first, p, tok)):
                    continue
                w = self.writer.get(cs)  # a prefix-cache hit: same adapter identity, same tokens up to p
                assert w is not None and seq.prefix_id is not None and w.prefix_id == seq.prefix_id, (seq, p, got)
                assert got[1:] == (p, tok) and w.token_ids[: p + 1] == seq.token_ids[: p + 1], (seq, p, got)
        assert b.logits_indices() == [qs[i + 1] - 1 for i in range(b.num_seqs) if b.sample[i]]
        assert all(n == 1 for n in b.num_new_tokens[: b.num_decodes])
        assert all(n > 1 for n in b.num_new_tokens[b.num_decodes :])
        ahead = int(b.ahead)  # an ahead decode feeds the token sampled after the last one appended
        decodes = [
            n == 1 and st + 1 == s.num_tokens + ahead and st >= s.num_prompt_tokens
            for s, st, n in zip(b.seqs, b.start, b.num_new_tokens)
        ]
        self.log.append(
            StepLog(b, {s.adapter for s in b.seqs}, self.sched.num_running, dict(self.slots.resident), decodes)
        )

    def run(self, seqs=(), feed=None, max_steps: int = 100_000, stop=None) -> list[Sequence]:
        """Add `seqs` (or feed lazily from the iterator `feed` while the scheduler wants more) and step
        until everything finished."""
        for s in seqs:
            self.sched.add(s)
        it = iter(feed) if feed is not None else None
        for _ in range(max_steps):
            while it is not None and self.sched.wants_more():
                nxt = next(it, None)
                if nxt is None:
                    it = None
                    break
                self.sched.add(nxt)
            if self._ahead is None and not self.sched.has_unfinished() and it is None:
                for s in self.sched.pop_finished():
                    self.finished.append(s)
                return self.finished
            self.step(stop)
        raise AssertionError("simulation did not finish")
