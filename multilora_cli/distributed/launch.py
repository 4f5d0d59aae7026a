"""Entry of a data-parallel `multilora run`: start or join the process group, then rank 0 runs the job.

`--data-parallel N` (one machine): this process becomes rank 0 and spawns ranks 1..N-1 (one per GPU, cuda:i,
or N CPU workers sharing the cores). Under torchrun every rank runs this same command: rank 0 runs the job,
the others serve (worker.py). Rank 0 is the only reader of the input and the only writer of the output.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from multilora_cli.distributed.group import (
    DistContext,
    destroy,
    init_groups,
    new_store_dir,
    pin_device,
    pin_local_rank,
    store_url,
    torchrun_env,
    visible_devices,
)
from multilora_cli.distributed.shard import SHARDINGS
from multilora_cli.engine.device import resolve_device
from multilora_cli.errors import EngineError, MultiloraError, UsageError
from multilora_cli.run.config import RunConfig


def run_distributed(cfg: RunConfig) -> int:
    """Run `cfg` (a RunConfig) over several processes; returns the exit code on rank 0, 0 on a worker."""
    if cfg.dp_sharding not in SHARDINGS:
        raise UsageError(f"sharding must be one of {', '.join(SHARDINGS)}, got {cfg.dp_sharding!r}")
    env = torchrun_env()
    if env is not None:
        rank, world, local_rank = env
        if cfg.data_parallel not in (1, world):
            raise UsageError(
                f"--data-parallel {cfg.data_parallel} disagrees with torchrun's WORLD_SIZE={world}",
                hint="under torchrun leave --data-parallel out: torchrun decides the worker count",
            )
        pinned = cfg.engine.device != "cpu" and pin_local_rank(local_rank)
        cuda = resolve_device(cfg.engine.device) == "cuda"
        ctx = init_groups(rank, world, local_rank, "torchrun", cuda, device_index=0 if pinned else local_rank)
        return _run(ctx, cfg, threads=None)
    n = cfg.data_parallel
    cuda = resolve_device(cfg.engine.device) == "cuda"
    import torch

    if cuda and torch.cuda.device_count() < n:
        raise UsageError(
            f"--data-parallel {n} needs {n} GPUs but {torch.cuda.device_count()} are visible",
            hint="lower --data-parallel, or check CUDA_VISIBLE_DEVICES",
        )
    threads = None if cuda else max(1, torch.get_num_threads() // n)
    gpus = visible_devices(n) if cuda else None  # rank r gets gpus[r]; rank 0 (this process) uses cuda:0
    ctx = _spawn(n, cuda, threads, gpus)
    return _run(ctx, cfg, threads)


# -- spawn (--data-parallel N) ---------------------------------------------------------------------------------
def _spawn(n: int, cuda: bool, threads: int | None, gpus: list[str] | None) -> DistContext:
    """Start ranks 1..n-1 and join the group as rank 0. A worker that dies while starting fails the run now
    instead of leaving rank 0 waiting for it at the rendezvous."""
    import torch.multiprocessing as mp

    if Path("/sys/class/net/lo").exists():  # every rank is on this machine: talk over loopback
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = new_store_dir()
    url = store_url(store)
    procs = mp.start_processes(
        _spawned_worker, args=(n, url, cuda, threads, gpus), nprocs=n - 1, join=False, start_method="spawn"
    )
    box: dict = {}

    def join() -> None:
        try:
            box["ctx"] = init_groups(0, n, 0, "spawn", cuda, url)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    t = threading.Thread(target=join, daemon=True, name="multilora-rendezvous")
    t.start()
    while t.is_alive():
        t.join(timeout=0.5)
        dead = [(i + 1, p.exitcode) for i, p in enumerate(procs.processes) if p.exitcode not in (None, 0)]
        if dead and t.is_alive():
            _terminate(procs)
            r, code = dead[0]
            raise EngineError(f"worker {r} exited with code {code} while starting; see its messages above")
    if "error" in box:
        _terminate(procs)
        raise EngineError(f"could not form the worker group: {box['error']}")
    ctx = box["ctx"]
    ctx.procs, ctx.store_dir = procs, store
    return ctx


def _spawned_worker(i: int, world: int, url: str, cuda: bool, threads: int | None, gpus: list[str] | None) -> None:
    """Body of a spawned rank (i + 1): it sees only its own GPU. Ctrl-C is rank 0's to handle: it stops the
    workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rank = i + 1
    if gpus:
        pin_device(gpus[rank])
    from multilora_cli.distributed.worker import serve

    if threads:
        import torch

        torch.set_num_threads(threads)
    ctx = init_groups(rank, world, rank, "spawn", cuda, url)
    try:
        serve(ctx)
    except MultiloraError as e:
        print(f"multilora: worker {rank}: error: {e.one_line()}", file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        destroy(None)


def _terminate(procs) -> None:
    for p in procs.processes:
        if p.exitcode is None:
            p.terminate()
    for p in procs.processes:
        p.join(timeout=10)
        if p.exitcode is None:
            p.kill()
            p.join(timeout=5)


# -- both launchers ----------------------------------------------------------------------------------------------
def _on_sigterm(signum, frame):
    raise EngineError("terminated by the launcher (another worker failed or the job was cancelled)")


def _run(ctx: DistContext, cfg: RunConfig, threads: int | None) -> int:
    from multilora_cli.distributed.coordinator import DistributedEngine
    from multilora_cli.distributed.scan import spool_stdin
    from multilora_cli.distributed.worker import serve
    from multilora_cli.run.job import RunJob
    from multilora_cli.run.plan import EnginePlan

    if ctx.rank != 0:
        try:
            serve(ctx)
        finally:
            destroy(ctx)
        return 0
    state: dict = {}

    def factory(plan: EnginePlan) -> DistributedEngine:
        state["started"] = True
        state["engine"] = DistributedEngine(ctx, plan, sharding=cfg.dp_sharding, threads=threads)
        return state["engine"]

    spooled = None
    ok = False
    if ctx.launcher == "torchrun":
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if cfg.input == "-":  # sharding reads the input twice: keep stdin in a file
            spooled = cfg.input = spool_stdin()
        rc = RunJob(cfg, engine_factory=factory).run()
        ok = True
        return rc
    finally:
        _shutdown(ctx, state, ok)
        if spooled:
            Path(spooled).unlink(missing_ok=True)


def _shutdown(ctx: DistContext, state: dict, ok: bool) -> None:
    """Success: workers got "end" and reported; ones never started get "stop". Failure: stop the feeder, tell
    every worker to stop, and end spawned ones that do not."""
    engine = state.get("engine")
    if not ok and engine is not None:
        engine.close()
    if not ok or not state.get("started"):
        if engine is None or not engine.feeding():
            for r in ctx.workers:
                try:
                    ctx.down[r].send(("stop",))
                except Exception:  # noqa: BLE001 - that worker is already gone
                    pass
    if ctx.procs is not None:
        if ok:
            for p in ctx.procs.processes:
                p.join(timeout=60)
        _terminate(ctx.procs)
    destroy(ctx)
