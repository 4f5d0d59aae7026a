"""A worker (rank > 0): build the engine rank 0 describes, run the requests it sends, stream results back.

Three threads, each owning one thing: the receiver owns the down channel (requests into an inbox), the main
thread owns the engine (inbox -> Engine.generate -> outbox), the sender owns the up channel (outbox -> batched
"results" messages, then "done" or "failed"). The engine pulls requests lazily, so a worker starts generating
as soon as its first requests arrive. If rank 0 goes away, the channels fail and the worker exits 1.
"""

from __future__ import annotations

import itertools
import os
import queue
import sys
import threading
import time
from pathlib import Path

from multilora_cli.distributed import protocol as P
from multilora_cli.distributed.group import DistContext
from multilora_cli.errors import EngineError, MultiloraError

MAX_BATCH = 256  # results per message


def build_engine(ctx: DistContext, engine_cfg, adapters: dict[str, str], opts: dict):
    """The worker's Engine on its GPU (or on CPU with its share of the threads)."""
    import torch

    from multilora_cli.engine.engine import Engine

    if opts.get("threads"):
        torch.set_num_threads(int(opts["threads"]))
    if ctx.cuda:
        torch.cuda.set_device(ctx.device_index)
    host = P.where()["host"]
    for what, path in [("model directory", engine_cfg.model), *((f"adapter {n!r}", p) for n, p in adapters.items())]:
        if not Path(path).exists():
            raise EngineError(
                f"worker {ctx.rank} on {host}: {what} {path} not found",
                hint="on several nodes the model and adapters must be at the same paths on every "
                "node (a shared filesystem or the same Hugging Face cache)",
            )
    return Engine(engine_cfg, {n: Path(p) for n, p in adapters.items()})


def _die(ctx: DistContext, what: str, e: BaseException) -> None:
    print(
        f"multilora: worker {ctx.rank}: lost rank 0 while {what} ({type(e).__name__}: {e}); exiting",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


class _Receiver(threading.Thread):
    """down channel -> inbox of Requests; None marks the end."""

    def __init__(self, ctx: DistContext):
        super().__init__(name=f"multilora-recv-{ctx.rank}", daemon=True)
        self.ctx = ctx
        self.inbox: queue.Queue = queue.Queue()

    def run(self) -> None:
        chan = self.ctx.down[self.ctx.rank]
        while True:
            try:
                msg = chan.recv()
            except Exception as e:  # noqa: BLE001 - rank 0 is gone: the run is over
                _die(self.ctx, "waiting for requests", e)
                return
            if msg[0] == P.REQUESTS:
                for req in msg[1]:
                    self.inbox.put(req)
            else:  # END (finish what is queued) or STOP (the run failed: exit now)
                if msg[0] == P.STOP:
                    os._exit(1)
                self.inbox.put(None)
                return

    def requests(self):
        """The requests in arrival order. Waits for the first one before returning, so the engine's
        generation clock starts with work, not with waiting for the other workers to load."""
        first = self.inbox.get()
        if first is None:
            return iter(())
        return itertools.chain([first], iter(self.inbox.get, None))


class _Sender(threading.Thread):
    """outbox -> up channel, batching whatever finished meanwhile; ends after "done" or "failed"."""

    def __init__(self, ctx: DistContext, engine):
        super().__init__(name=f"multilora-send-{ctx.rank}", daemon=True)
        self.ctx = ctx
        self.engine = engine
        self.outbox: queue.Queue = queue.Queue()
        self.sent = 0
        self.exit_after = P.test_exit_after(ctx.rank)

    def run(self) -> None:
        chan = self.ctx.up[self.ctx.rank]
        while True:
            items = [self.outbox.get()]
            while len(items) < MAX_BATCH:
                try:
                    items.append(self.outbox.get_nowait())
                except queue.Empty:
                    break
            results = [x for x in items if not isinstance(x, list)]
            control = [x for x in items if isinstance(x, list)]  # [DONE, ...] / [FAILED, ...]
            if self.exit_after is not None:
                results = results[: max(self.exit_after - self.sent, 0)]
            try:
                if results:
                    chan.send((P.RESULTS, results, {"slot_loads": self.engine.slot_loads}))
                    self.sent += len(results)
                if self.exit_after is not None and self.sent >= self.exit_after:
                    os._exit(17)  # the tests' killed worker
                if control:
                    chan.send(tuple(control[0]))
                    return
            except Exception as e:  # noqa: BLE001
                _die(self.ctx, "sending results", e)
                return


def serve(ctx: DistContext) -> None:
    """Run worker `ctx.rank` until rank 0 says the run is over. Raises MultiloraError on a fatal problem
    (after telling rank 0)."""
    msg = ctx.down[ctx.rank].recv()
    if msg[0] != P.START:
        return
    _, engine_cfg, adapters, opts = msg
    up = ctx.up[ctx.rank]
    t0 = time.perf_counter()
    try:
        engine = build_engine(ctx, engine_cfg, adapters, opts)
    except MultiloraError as e:
        up.send((P.FAILED, e.one_line()))
        raise
    except Exception as e:  # noqa: BLE001 - report it as this worker's failure, then fail
        up.send((P.FAILED, f"{type(e).__name__}: {e}"))
        raise
    info = {**P.where(str(engine.device)), "rank": ctx.rank, "load_seconds": round(time.perf_counter() - t0, 3)}
    up.send((P.READY, info))
    receiver, sender = _Receiver(ctx), _Sender(ctx, engine)
    receiver.start()
    sender.start()
    try:
        for res in engine.generate(receiver.requests()):
            sender.outbox.put(P.pack_result(res))
    except BaseException as e:
        text = e.one_line() if isinstance(e, MultiloraError) else f"{type(e).__name__}: {e}"
        sender.outbox.put([P.FAILED, text])
        sender.join(timeout=30)
        raise
    finally:
        engine.close()
    sender.outbox.put([P.DONE, engine.stats.to_dict(), info])
    sender.join()
