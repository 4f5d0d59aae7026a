"""Host time of the scheduler (`schedule` + `postprocess`) per step on the bench_e2e workload, GPU-free.

    python -m benchmarks.profile_scheduler                          # ms/step, every row
    python -m benchmarks.profile_scheduler --rows 64 --profile      # + cProfile top
    python -m benchmarks.profile_scheduler --trace-out T.txt        # batch trace
    python -m benchmarks.profile_scheduler --rows 64,1000 --requests 2048 --warm --preloads 2 --hash-ms 4 \
        --step-ms 3.7 --repeats 1                                 # + identities hashed on workers, GPU-paced

Drives the real Scheduler / SlotManager / BlockManager the way `Engine.generate` does (lazy feed, schedule,
"run", postprocess with a StopChecker, pop_finished) with the bench_e2e settings (1024 requests of 128 + 128
tokens, ignore_eos, 256 seats, 8192 tokens a step, KV for 256 full sequences: no preemption). With adapters the
slots prefetch and stage like the engine's, but on an inline pool (work done at submit), so runs are
deterministic and the trace of scheduled batches can be compared before / after a scheduler change. Each run is
inside the engine's heap freeze (engine/gc_heap.py) and counts its GC collections (gen 0/1/2) and seconds.
`--hash-ms`: sequences get prefix-cache identities as the engine's feed gives them (engine/identities.py, the
engine's workers for 2 readers), each hash a sleep of that many ms (hashlib lets go of the GIL as a sleep does);
the row then reports the hashes the admissions still made on the step loop's thread (`on loop`), their seconds.
"""

from __future__ import annotations

import cProfile
import hashlib
import pstats
import statistics
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

from benchmarks.timing import parser
from multilora_cli.bench.suite import GcClock
from multilora_cli.bench.workload import Workload
from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.block_manager import BlockManager
from multilora_cli.engine.detokenizer import StopChecker
from multilora_cli.engine.gc_heap import FrozenHeap
from multilora_cli.engine.identities import AdapterIdentities, identity_threads
from multilora_cli.engine.request import Request
from multilora_cli.engine.scheduler import Scheduler
from multilora_cli.engine.sequence import Sequence
from multilora_cli.engine.slots import SlotManager

ROWS = {
    "base": (0, "uniform", None),
    "64": (64, "uniform", 64),
    "64z": (64, "zipf", 64),
    "256/64": (256, "uniform", 64),
    "1000": (1000, "uniform", 1000),  # issue 38: every adapter has a slot
}


def make_seq(i: int, adapter: str | None, prompt_len: int, max_tokens: int) -> Sequence:
    """Request i of the workload: a fixed prompt of `prompt_len` ids, eos ignored (as the e2e benchmark's)."""
    req = Request(key=i, id=f"r{i}", adapter=adapter, sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return Sequence.from_request(i, req, [1 + (i * 13 + j) % 50 for j in range(prompt_len)], engine_seed=1)


def fake_token(seed: int, position: int) -> int:
    """The "GPU": a token id that depends only on the sequence and the position, so traces are reproducible."""
    return 3 + (seed * 7919 + position * 104729) % 997


class InlinePool:
    """Executor stand-in: runs the job at submit, so prefetch/staging cost the same bookkeeping, deterministically."""

    def submit(self, fn, *args):
        fut = Future()
        fut.set_result(fn(*args))
        return fut


def make_engine(work: Workload, base_only: bool):
    block = 16
    per_seq = -(-(work.prompt_len + work.output_len) // block) + 1  # as bench/suite.engine_config
    cfg = EngineConfig(
        model="m",
        max_loras=work.max_loras,
        max_cpu_loras=work.num_adapters + work.max_loras,
        max_num_seqs=work.max_num_seqs,
        max_num_batched_tokens=work.max_num_batched_tokens,
        max_model_len=work.prompt_len + work.output_len,
        block_size=block,
        num_kv_blocks=work.max_num_seqs * per_seq,
    )
    slots = SlotManager(
        cfg.max_loras,
        cfg.max_cpu_loras,
        load_cpu=lambda n: SimpleNamespace(name=n, staged=None),
        install=lambda slot, n, obj: None,
        evict=lambda slot, n: None,
        stage=lambda obj: setattr(obj, "staged", True) or True,
        stage_ahead=8,
    )
    if not base_only:
        slots._pool = InlinePool()  # the engine reads adapters on prefetch threads; a base-only run has none
    bm = BlockManager(cfg.num_kv_blocks, block)
    return Scheduler(cfg, bm, slots, max_model_len=cfg.max_model_len), StopChecker(max_model_len=cfg.max_model_len)


def slow_hash(ms: float):
    """A stand-in for adapters/identity.py's hash: `ms` of GIL-free waiting, then a name-derived identity."""

    def hash_fn(path: Path) -> str:
        time.sleep(ms / 1e3)
        return f"lora:{path.name}"

    return hash_fn


def run(
    row: str,
    trace: list | None = None,
    requests: int = 1024,
    warm: bool = False,
    preloads: int = 0,
    hash_ms: float | None = None,
    step_ms: float = 0.0,
    run_ahead: bool = False,
    hash_at_start: bool = False,
) -> dict:
    """One row. `warm`: the slots start as bench_e2e's warm-up leaves them (its min(slots, 2 x seats) other
    adapters loaded, then evicted: `SlotManager.evict_idle`); `preloads`: `Scheduler.preload` after each schedule,
    as the engine does on CUDA; `hash_ms`: prefix-cache identities hashed by workers (`AdapterIdentities`);
    `step_ms`: the "GPU" step's time, slept (untimed) after each schedule, so background work has the time it has
    in a real run; `hash_at_start`: the identities are queued and hashed before the run, as the engine queues them
    at its start (`AdapterIdentities.start_all`); `run_ahead`: `Scheduler.schedule_ahead` after each launch, as the engine on a GPU (a step
    planned ahead hides the host time before it; the others' is `exposed`)."""
    with FrozenHeap().during(), GcClock() as clock:
        return _run(row, trace, requests, warm, preloads, hash_ms, step_ms, run_ahead, hash_at_start, clock)


def _run(row, trace, requests, warm, preloads, hash_ms, step_ms, run_ahead, hash_at_start, clock) -> dict:
    n_ad, dist, max_loras = ROWS[row]
    work = Workload(num_adapters=n_ad, distribution=dist, max_loras=max_loras, num_requests=requests)
    sched, stop = make_engine(work, base_only=n_ad == 0)
    if warm and n_ad:
        for i in range(min(work.max_loras, 2 * work.max_num_seqs)):
            sched.slots.acquire(f"warm{i}")
        sched.slots.evict_idle()  # as bench_e2e: the warm-up's adapters leave their slots
    slots = sched.slots
    counts0 = (slots.loads, slots.evictions, slots.preloads)  # the row's own, as bench_e2e counts them
    idents = None
    if hash_ms is not None and n_ad:
        idents = AdapterIdentities(
            {a: Path(a) for a in work.adapter_names}, threads=identity_threads(2), hash_fn=slow_hash(hash_ms)
        )
        if hash_at_start:  # as Engine.__init__: every hash queued at start, done within its seconds of start-up
            idents.start_all(work.adapter_names)
            for a in work.adapter_names:
                AdapterIdentities.resolve(idents.start(a))  # (the last ones on this thread: start-up time)
            idents.caller_hashes, idents.caller_seconds = 0, 0.0  # the run's own count
    feed = iter([make_seq(i, a, work.prompt_len, work.output_len) for i, a in enumerate(work.assignment())])
    t_sched = t_post = t_feed = t_exposed = 0.0
    steps = done = exposed = 0
    pc = time.perf_counter
    ahead = None
    fed_all = False
    t_gap = pc()  # since the last step's postprocess began: exposed host time unless the next step ran ahead
    while True:
        t0 = pc()
        while not fed_all and sched.wants_more():
            seq = next(feed, None)
            if seq is None:
                fed_all = True
                break
            if idents is not None and seq.adapter is not None:
                seq.prefix_id = idents.start(seq.adapter)  # as Engine._prefix_id
            sched.add(seq)
        t_feed += pc() - t0
        if ahead is not None:
            b, ahead = ahead, None
        else:
            if not sched.has_unfinished():
                break
            t0 = pc()
            b = sched.schedule()
            assert b is not None, "no progress"
            t_sched += pc() - t0
            exposed += 1
            t_exposed += pc() - t_gap
        t0 = pc()
        # as Engine.generate on a GPU: the next decode step planned (and launched) while this one runs
        ahead = sched.schedule_ahead(b, more_requests=not fed_all) if run_ahead else None
        if preloads:
            sched.preload(preloads)
        t_sched += pc() - t0
        ids = [fake_token(s.seed, s.num_completion_tokens) for s in b.sampled_seqs()]  # the "GPU"
        if step_ms:
            time.sleep(step_ms / 1e3)
        if trace is not None:
            trace.append(f"{[s.seq_id for s in b.seqs]} {b.num_new_tokens} {b.slots} {[s.seq_id for s in b.preempted]}")
        t_gap = t2 = pc()
        sched.postprocess(b, ids, stop)
        t_post += pc() - t2
        steps += 1
        done += len(sched.pop_finished())
    assert done == work.num_requests and sched.num_preemptions == 0, (done, sched.num_preemptions)
    if idents is not None:
        idents.close()
    return {
        "steps": steps,
        "sched_ms": 1e3 * t_sched / steps,
        "post_ms": 1e3 * t_post / steps,
        "feed_ms": 1e3 * t_feed / steps,
        "exposed": (exposed, t_exposed),
        "gc": (*clock.collections, clock.seconds),
        "on_loop": (idents.caller_hashes, idents.caller_seconds) if idents is not None else None,
        "loads": slots.loads - counts0[0],
        "evictions": slots.evictions - counts0[1],
        "preloads": slots.preloads - counts0[2],
    }


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--warm", action="store_true", help="slots start full of idle warm-up adapters (bench_e2e)")
    ap.add_argument("--preloads", type=int, default=0, help="Scheduler.preload per step (the engine: 2 on CUDA)")
    ap.add_argument("--hash-ms", type=float, default=None, help="identity hashes of this many ms (workers)")
    ap.add_argument(
        "--hash-at-start", action="store_true", help="with --hash-ms: hashed before the run, as the engine's start does"
    )
    ap.add_argument("--run-ahead", action="store_true", help="plan decode steps ahead, as the engine on a GPU")
    ap.add_argument("--step-ms", type=float, default=0.0, help="sleep this long per step (the GPU step, untimed)")
    ap.add_argument("--profile", action="store_true", help="cProfile one more run of each row (top 25, tottime)")
    ap.add_argument("--trace-out", help="write every row's scheduled batches (ids, tokens, slots, preempted) here")
    args = ap.parse_args()
    rows = args.rows.split(",")
    lines = []
    for row in rows:
        trace: list[str] = []
        kw = dict(
            requests=args.requests,
            warm=args.warm,
            preloads=args.preloads,
            hash_ms=args.hash_ms,
            step_ms=args.step_ms,
            run_ahead=args.run_ahead,
            hash_at_start=args.hash_at_start,
        )
        run(row, trace, **kw)  # warm-up, and the trace (timing never changes a decision)
        digest = hashlib.sha256("\n".join(trace).encode()).hexdigest()[:16]
        lines += [f"# row {row}", *trace]
        res = [run(row, **kw) for _ in range(args.repeats)]
        s = [r["sched_ms"] for r in res]
        p = [r["post_ms"] for r in res]
        fd = [r["feed_ms"] for r in res]
        g = res[0]["gc"]
        hashes = res[0]["on_loop"]
        ex = res[0]["exposed"]
        on_loop = f" | {ex[0]} steps not ahead ({ex[1]:.3f} s before them)" if args.run_ahead else ""
        on_loop += f" | hashes on loop {hashes[0]} ({hashes[1]:.3f} s)" if hashes is not None else ""
        print(
            f"{row:>7}: {res[0]['steps']} steps, {res[0]['loads']} loads, {res[0]['evictions']} evictions, "
            f"{res[0]['preloads']} preloads | schedule "
            f"{statistics.median(s):.3f} ms/step (min {min(s):.3f}) | postprocess {statistics.median(p):.3f} "
            f"(min {min(p):.3f}) | total {statistics.median(a + b for a, b in zip(s, p)):.3f} | feed "
            f"{statistics.median(fd):.3f} | gc {g[0]}/{g[1]}/{g[2]} {1e3 * g[3]:.1f} ms{on_loop} | trace {digest}"
        )
        if args.profile:
            prof = cProfile.Profile()
            prof.runcall(run, row, **kw)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    if args.trace_out:
        with open(args.trace_out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
