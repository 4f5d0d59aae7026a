"""Rank 0 of a data-parallel run: the engine `RunJob` drives, made of one local Engine and W-1 remote ones.

`DistributedEngine` has the surface RunJob uses (run/engine_api.JobEngine), built from the job's EnginePlan, so
the single-process job — reading, pre-flight, --resume, ordered writing, stats — is the same code for one
worker or many. Here:
  startup: send "start" to every worker (they load in parallel), scan the input once for (adapter, tokens)
    of the lines left to run, shard them (adapter affinity), build the local engine, wait for "ready".
  generate: a feeder thread pulls RunJob's request stream and routes each request by its key's worker
    (batched per worker), the local engine runs in a thread, one collector thread per worker receives
    results; the caller's thread merges everything from one event queue and yields Results.
  A worker that dies or fails raises EngineError naming it; RunJob then reports the valid prefix written.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time

from multilora_cli.distributed import protocol as P
from multilora_cli.distributed.group import DistContext
from multilora_cli.distributed.scan import LineCosts, scan_costs
from multilora_cli.distributed.shard import shard, summarize
from multilora_cli.distributed.stats import merge_stats, print_workers
from multilora_cli.errors import EngineError, MultiloraError
from multilora_cli.run.plan import EnginePlan

FLUSH_SECONDS = 0.05  # a worker's batch of requests leaves at least this often while the feeder reads
FIRST_BATCH, MAX_BATCH = 8, 256  # batches grow from FIRST_BATCH so every worker starts early


class DistributedEngine:
    """One engine spread over `ctx.world` ranks; built by RunJob's engine factory on rank 0 from its `plan`."""

    def __init__(self, ctx: DistContext, plan: EnginePlan, *, sharding: str = "affinity", threads: int | None = None):
        import torch

        from multilora_cli.engine.engine import Engine
        from multilora_cli.engine.generation_config import read_generation_config
        from multilora_cli.io.sampling import SamplingResolver

        self.ctx = ctx
        self.sharding = sharding
        self.events: queue.Queue = queue.Queue()
        self.live_loads: dict[int, int] = {r: 0 for r in ctx.workers}  # fixed keys: read from other threads
        self.info: dict[int, dict] = {}
        self.worker_stats: dict[int, dict] = {}
        self.returned: dict[int, int] = {r: 0 for r in range(ctx.world)}
        self._abort = threading.Event()
        self.wall_seconds = 0.0
        engine_cfg = plan.config
        adapters = {n: str(p) for n, p in plan.adapters.items()}
        opts = {"threads": threads}
        for r in ctx.workers:  # they load their engines while this rank scans the input
            ctx.down[r].send((P.START, engine_cfg, adapters, opts))
        self._collectors = {r: self._spawn(self._collect, r) for r in ctx.workers}
        resolver = SamplingResolver(read_generation_config(engine_cfg.model).sampling, plan.sampling)
        self.costs: LineCosts = scan_costs(plan.input, plan.resumed, plan.engine_adapter, resolver.base["max_tokens"])
        self.assign = shard(self.costs.adapters, self.costs.tokens, ctx.world, sharding)
        self.summary = summarize(self.assign, self.costs.adapters, self.costs.tokens, ctx.world)
        t0 = time.perf_counter()
        if threads:
            torch.set_num_threads(threads)
        if ctx.cuda:
            torch.cuda.set_device(ctx.device_index)
        self.local = Engine(engine_cfg, plan.adapters, scans=plan.scans)
        self.default_sampling = self.local.default_sampling
        self.info[0] = {
            **P.where(str(self.local.device)),
            "rank": 0,
            "load_seconds": round(time.perf_counter() - t0, 3),
        }
        self._wait_ready()

    # -- threads ----------------------------------------------------------------------------------------------
    def _spawn(self, fn, *args) -> threading.Thread:
        t = threading.Thread(target=fn, args=args, daemon=True, name=f"multilora-{fn.__name__}")
        t.start()
        return t

    def _collect(self, r: int) -> None:
        """Worker r's up channel -> events."""
        chan = self.ctx.up[r]
        while True:
            try:
                msg = chan.recv()
            except Exception as e:  # noqa: BLE001 - the worker is gone
                self.events.put(("lost", r, f"{type(e).__name__}: {e}"))
                return
            self.events.put((msg[0], r, *msg[1:]))
            if msg[0] in (P.DONE, P.FAILED):
                return

    def _feed(self, requests) -> None:
        """RunJob's requests -> the local inbox or a worker's down channel, in input order per worker."""
        local: queue.Queue = self._local_inbox
        start, assign, ctx = self.costs.start_key, self.assign, self.ctx
        bufs: dict[int, list] = {r: [] for r in ctx.workers}
        limit = {r: FIRST_BATCH for r in ctx.workers}
        last = time.monotonic()
        sending = 0
        try:
            for req in requests:
                if self._abort.is_set():
                    return
                i = req.key - start
                w = assign[i] if 0 <= i < len(assign) else 0  # a key the scan did not see: keep it local
                if w == 0:
                    local.put(req)
                else:
                    bufs[w].append(req)
                now = time.monotonic()
                due = [w] if w and len(bufs[w]) >= limit[w] else []
                if now - last > FLUSH_SECONDS:  # also flush the others: no worker waits on a slow trickle
                    due, last = list(ctx.workers), now
                for r in due:
                    if bufs[r]:
                        sending = r
                        ctx.down[r].send((P.REQUESTS, bufs[r]))
                        bufs[r] = []
                        limit[r] = min(limit[r] * 2, MAX_BATCH)
            for r in ctx.workers:
                sending = r
                if bufs[r]:
                    ctx.down[r].send((P.REQUESTS, bufs[r]))
                ctx.down[r].send((P.END,))
        except MultiloraError as e:  # e.g. the writer failed while recording an error line
            self.events.put(("error", 0, e))
        except Exception as e:  # noqa: BLE001 - a send failed: that worker is gone
            self.events.put(("lost", sending, f"{type(e).__name__}: {e}"))
        except BaseException as e:  # noqa: BLE001
            self.events.put(("error", 0, e))
        finally:
            local.put(None)

    def _local_requests(self):
        while (req := self._local_inbox.get()) is not None:
            yield req

    def _first_then_rest(self):
        """Wait for the first request before starting the engine, so its generation clock starts with work."""
        first = self._local_inbox.get()
        if first is None:
            return iter(())
        return itertools.chain([first], self._local_requests())

    def _run_local(self) -> None:
        try:
            if self.ctx.cuda:  # the current device is per thread: Triton launches on this thread's
                import torch

                torch.cuda.set_device(self.ctx.device_index)
            gen = self.local.generate(self._first_then_rest())
            for res in gen:
                self.events.put(("local", 0, res))
                if self._abort.is_set():
                    gen.close()
                    return
            self.events.put((P.DONE, 0, self.local.stats.to_dict(), self.info[0]))
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller's thread
            self.events.put(("error", 0, e))

    # -- startup and generation ----------------------------------------------------------------------------------
    def _wait_ready(self) -> None:
        ready = {0}
        while len(ready) < self.ctx.world:
            ev = self._next_event()
            if ev[0] == P.READY:
                self.info[ev[1]] = ev[2]
                ready.add(ev[1])
            else:
                self._fail(ev)

    def _next_event(self) -> tuple:
        while True:
            try:
                return self.events.get(timeout=1.0)
            except queue.Empty:
                self._check_processes()

    def _check_processes(self) -> None:
        """Spawned workers: a process that exited without reporting is a lost worker (its channel may not have
        noticed yet)."""
        procs = getattr(self.ctx.procs, "processes", None) or []
        for i, p in enumerate(procs):
            r = i + 1
            if p.exitcode is not None and p.exitcode != 0 and r not in self.worker_stats:
                self._collectors[r].join(timeout=2.0)  # let its own message ("failed", lost channel) come first
                self.events.put(("lost", r, f"exit code {p.exitcode}"))

    def generate(self, requests):
        """Yield every request's Result, from whichever worker ran it (any order)."""
        self._local_inbox: queue.Queue = queue.Queue()
        t0 = time.perf_counter()
        self._feeder = self._spawn(self._feed, requests)
        self._spawn(self._run_local)
        try:
            while len(self.worker_stats) < self.ctx.world:
                ev = self._next_event()
                kind, r = ev[0], ev[1]
                if kind == "local":
                    self.returned[0] += 1
                    yield ev[2]
                elif kind == P.RESULTS:
                    self.live_loads[r] = ev[3].get("slot_loads", 0)
                    self.returned[r] += len(ev[2])
                    for t in ev[2]:
                        yield P.unpack_result(t)
                elif kind == P.DONE:
                    self.worker_stats[r] = ev[2]
                    self.info[r] = {**self.info.get(r, {}), **ev[3]}
                else:
                    self._fail(ev)
        finally:
            self.wall_seconds = time.perf_counter() - t0
            if len(self.worker_stats) < self.ctx.world:
                self._abort.set()

    def _fail(self, ev: tuple) -> None:
        kind, r = ev[0], ev[1]
        if kind == "error":
            raise ev[2]
        who = self._who(r)
        if kind == P.FAILED:
            raise EngineError(f"{who} failed: {ev[2]}")
        if kind == "lost":
            raise EngineError(
                f"{who} died ({self._exit_reason(r, ev[2])}) after returning {self.returned.get(r, 0)} results",
                hint="its requests were not finished; see that worker's messages above",
            )
        raise EngineError(f"internal: unexpected message {kind!r} from worker {r}")

    def _who(self, r: int) -> str:
        info = self.info.get(r, {})
        bits = [b for b in (info.get("device"), info.get("host"), f"pid {info['pid']}" if "pid" in info else "") if b]
        return f"worker {r}" + (f" ({', '.join(bits)})" if bits else "")

    def _exit_reason(self, r: int, detail: str) -> str:
        procs = getattr(self.ctx.procs, "processes", None)
        if procs:
            p = procs[r - 1]
            p.join(timeout=5)
            if p.exitcode is not None:
                return f"exit code {p.exitcode}" if p.exitcode >= 0 else f"killed by signal {-p.exitcode}"
        return detail.split(". ")[0][:200]

    # -- stats ------------------------------------------------------------------------------------------------
    @property
    def slot_loads(self) -> int:
        """The local engine's live count + the last count each worker sent."""
        return self.local.slot_loads + sum(self.live_loads.values())

    @property
    def stats(self) -> _Stats:
        return _Stats(self)

    def annotate_stats(self, stats: dict) -> None:
        """RunJob hook: the run's stats JSON gets a top-level "data_parallel" section."""
        stats["data_parallel"] = merge_stats(self)["data_parallel"]

    def print_summary(self, stats: dict) -> None:
        """RunJob hook: the per-worker table after the run's summary."""
        print_workers(stats)

    def feeding(self) -> bool:
        """True while the feeder thread may still send on the down channels."""
        f = getattr(self, "_feeder", None)
        return f is not None and f.is_alive()

    def close(self) -> None:
        """Stop the local engine and the feeder (after a failure); the caller shuts the workers down."""
        self._abort.set()
        self.local.close()
        f = getattr(self, "_feeder", None)
        if f is not None:
            f.join(timeout=5.0)


class _Stats:
    """`engine.stats` as RunJob reads it: the merged EngineStats dict at the end."""

    def __init__(self, owner: DistributedEngine):
        self._owner = owner

    def to_dict(self) -> dict:
        return merge_stats(self._owner)
