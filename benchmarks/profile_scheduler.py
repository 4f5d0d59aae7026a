"""Host time of the scheduler (`schedule` + `postprocess`) per step on the bench_e2e workload, GPU-free.

    python -m benchmarks.profile_scheduler                          # ms/step, every row
    python -m benchmarks.profile_scheduler --rows 64 --profile      # + cProfile top
    python -m benchmarks.profile_scheduler --trace-out T.txt        # batch trace

Drives the real Scheduler / SlotManager / BlockManager the way `Engine.generate` does (lazy feed, schedule,
"run", postprocess with a StopChecker, pop_finished) with the bench_e2e settings (1024 requests of 128 + 128
tokens, ignore_eos, 256 seats, 8192 tokens a step, KV for 256 full sequences: no preemption). With adapters the
slots prefetch and stage like the engine's, but on an inline pool (work done at submit), so runs are
deterministic and the trace of scheduled batches can be compared before / after a scheduler change.
"""

from __future__ import annotations

import cProfile
import hashlib
import pstats
import statistics
import time
from concurrent.futures import Future
from types import SimpleNamespace

from benchmarks.timing import parser
from multilora_cli.bench.workload import Workload
from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.block_manager import BlockManager
from multilora_cli.engine.detokenizer import StopChecker
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


def run(row: str, trace: list | None = None, requests: int = 1024, warm: bool = False, preloads: int = 0) -> dict:
    """One row. `warm`: the slots start as bench_e2e's warm-up leaves them (min(slots, 2 x seats) other adapters
    resident, idle); `preloads`: `Scheduler.preload` after each schedule, as the engine does on CUDA."""
    n_ad, dist, max_loras = ROWS[row]
    work = Workload(num_adapters=n_ad, distribution=dist, max_loras=max_loras, num_requests=requests)
    sched, stop = make_engine(work, base_only=n_ad == 0)
    if warm and n_ad:
        for i in range(min(work.max_loras, 2 * work.max_num_seqs)):
            sched.slots.acquire(f"warm{i}")
    feed = iter([make_seq(i, a, work.prompt_len, work.output_len) for i, a in enumerate(work.assignment())])
    t_sched = t_post = 0.0
    steps = done = 0
    pc = time.perf_counter
    while True:
        while sched.wants_more() and (seq := next(feed, None)) is not None:
            sched.add(seq)
        if not sched.has_unfinished():
            break
        t0 = pc()
        b = sched.schedule()
        assert b is not None, "no progress"
        if preloads:
            sched.preload(preloads)
        t_sched += pc() - t0
        ids = [fake_token(s.seed, s.num_completion_tokens) for s in b.sampled_seqs()]  # the "GPU"
        if trace is not None:
            trace.append(f"{[s.seq_id for s in b.seqs]} {b.num_new_tokens} {b.slots} {[s.seq_id for s in b.preempted]}")
        t2 = pc()
        sched.postprocess(b, ids, stop)
        t_post += pc() - t2
        steps += 1
        done += len(sched.pop_finished())
    assert done == work.num_requests and sched.num_preemptions == 0, (done, sched.num_preemptions)
    return {
        "steps": steps,
        "sched_ms": 1e3 * t_sched / steps,
        "post_ms": 1e3 * t_post / steps,
        "loads": sched.slots.loads,
        "evictions": sched.slots.evictions,
        "preloads": sched.slots.preloads,
    }


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--warm", action="store_true", help="slots start full of idle warm-up adapters (bench_e2e)")
    ap.add_argument("--preloads", type=int, default=0, help="Scheduler.preload per step (the engine: 2 on CUDA)")
    ap.add_argument("--profile", action="store_true", help="cProfile one more run of each row (top 25, tottime)")
    ap.add_argument("--trace-out", help="write every row's scheduled batches (ids, tokens, slots, preempted) here")
    args = ap.parse_args()
    rows = args.rows.split(",")
    lines = []
    for row in rows:
        trace: list[str] = []
        kw = dict(requests=args.requests, warm=args.warm, preloads=args.preloads)
        run(row, trace, **kw)  # warm-up, and the trace (timing never changes a decision)
        digest = hashlib.sha256("\n".join(trace).encode()).hexdigest()[:16]
        lines += [f"# row {row}", *trace]
        res = [run(row, **kw) for _ in range(args.repeats)]
        s = [r["sched_ms"] for r in res]
        p = [r["post_ms"] for r in res]
        print(
            f"{row:>7}: {res[0]['steps']} steps, {res[0]['loads']} loads, {res[0]['evictions']} evictions, "
            f"{res[0]['preloads']} preloads | schedule "
            f"{statistics.median(s):.3f} ms/step (min {min(s):.3f}) | postprocess {statistics.median(p):.3f} "
            f"(min {min(p):.3f}) | total {statistics.median(a + b for a, b in zip(s, p)):.3f} | trace {digest}"
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
