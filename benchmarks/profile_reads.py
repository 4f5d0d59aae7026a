"""Where a bench row waits on adapter reads: a timeline of every read (pack) and every wait for one.

    python3 benchmarks/profile_reads.py --rows 256/64 --out $OUT/profile-reads.json
    python3 benchmarks/profile_reads.py --rows 256/64#3,256/64#1 --out ...   # prefetch threads, A/B
    python3 benchmarks/profile_reads.py --rows 256/64,256/64o,256/64m --out ...  # read paths, A/B (see main)

Runs bench_e2e rows (Llama-3-8B shapes, 1024 x (128 + 128)) with the engine's adapter reads (`_load_cpu`, on the
prefetch threads or the step loop's thread) and the step loop's waits for them (`SlotManager._host_copy`) logged
with timestamps. Prints, per row: reads (count, median / p90 ms, on which threads), waits (count, total s, how
many found no read in flight and read on the step loop's thread), and the waits over time (per second of the
run), so the cause of the row's `read_wait_s` can be read off: slow reads, too few threads, or reads started late.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from multilora_cli.bench import adapters as synth  # noqa: E402
from multilora_cli.bench.model_dir import write_model_dir  # noqa: E402
from multilora_cli.bench.roofline import measure_bandwidth  # noqa: E402
from multilora_cli.bench.suite import run_multilora_row  # noqa: E402
from multilora_cli.bench.workload import Workload  # noqa: E402
from multilora_cli.engine import engine as engine_mod  # noqa: E402
from multilora_cli.engine import slots as slots_mod  # noqa: E402

EVENTS: list[dict] = []


def instrument() -> None:
    load = synth.SyntheticEngine._load_cpu
    host_copy = slots_mod.SlotManager._host_copy

    def timed_load(self, name):
        t0 = time.perf_counter()
        try:
            return load(self, name)
        finally:
            EVENTS.append(
                {
                    "kind": "read",
                    "name": name,
                    "t0": t0,
                    "t1": time.perf_counter(),
                    "thread": threading.current_thread().name,
                }
            )

    def timed_copy(self, name):
        cached = name in self._cpu
        fut = self._inflight.get(name)
        state = "cached" if cached else "none" if fut is None else "done" if fut.done() else "running"
        t0 = time.perf_counter()
        try:
            return host_copy(self, name)
        finally:
            EVENTS.append({"kind": "claim", "name": name, "t0": t0, "t1": time.perf_counter(), "state": state})

    generate = synth.SyntheticEngine.generate

    def marked_generate(self, *a, **kw):
        EVENTS.append({"kind": "generate", "t0": time.perf_counter()})  # the row's last one is the timed run
        yield from generate(self, *a, **kw)

    synth.SyntheticEngine._load_cpu = timed_load
    synth.SyntheticEngine.generate = marked_generate
    slots_mod.SlotManager._host_copy = timed_copy


def summarise(events: list[dict], t_start: float) -> dict:
    reads = [e for e in events if e["kind"] == "read"]
    claims = [e for e in events if e["kind"] == "claim"]
    ms = sorted(1e3 * (e["t1"] - e["t0"]) for e in reads)
    by_state: dict[str, list[float]] = {}
    for c in claims:
        by_state.setdefault(c["state"], []).append(c["t1"] - c["t0"])
    per_second: dict[int, float] = {}
    for c in claims:
        per_second[int(c["t0"] - t_start)] = per_second.get(int(c["t0"] - t_start), 0.0) + (c["t1"] - c["t0"])
    return {
        "reads": len(reads),
        "read_ms_median": statistics.median(ms) if ms else 0.0,
        "read_ms_p90": ms[int(0.9 * (len(ms) - 1))] if ms else 0.0,
        "read_threads": sorted({e["thread"] for e in reads}),
        "reads_on_step_thread": sum(e["thread"] == "MainThread" for e in reads),
        "claims": {k: {"n": len(v), "wait_s": sum(v)} for k, v in by_state.items()},
        "wait_s_by_second": {k: round(v, 3) for k, v in sorted(per_second.items())},
        "first_read_s": min((e["t0"] - t_start for e in reads), default=None),
        "last_read_end_s": max((e["t1"] - t_start for e in reads), default=None),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="llama-3-8b")
    p.add_argument("--rows", default="256/64")
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (use --preset tiny)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    instrument()
    default_threads = engine_mod.PREFETCH_THREADS
    device = torch.device(args.device)
    bw = measure_bandwidth(device)
    report = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "command": " ".join(sys.argv),
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(args.preset, Path(tmp) / "model")
        for row in args.rows.split(","):
            spec, _, threads = row.partition("#")  # "256/64#1": one prefetch thread (A/B in one process)
            engine_mod.PREFETCH_THREADS = int(threads or default_threads)
            # read path: "256/64" files read straight into the arena (engine/direct_read.py); "256/64o" files
            # through load_adapter + pack_adapter; "256/64m" tensors packed from memory (the bench until session 9)
            mode = spec[-1] if spec[-1] in "om" else "d"
            spec = spec.rstrip("om")
            engine_mod.DIRECT_READ = mode == "d"
            synth.SyntheticEngine.FROM_MEMORY = mode == "m"
            n, _, slots = spec.partition("/")
            work = Workload(
                preset=args.preset, num_adapters=int(n), max_loras=int(slots or n), num_requests=args.requests
            )
            EVENTS.clear()
            t_start = time.perf_counter()
            res = run_multilora_row(work, model_dir, device, bandwidth=bw)
            t_run = [e["t0"] for e in EVENTS if e["kind"] == "generate"][-1]  # the timed run's start
            timed = [e for e in EVENTS if e["kind"] != "generate" and e["t1"] >= t_run]
            out = {
                "row": row,
                "read_path": {"d": "direct", "o": "load+pack", "m": "memory"}[mode],
                "prefetch_threads": engine_mod.PREFETCH_THREADS,
                "tok_s": res.tokens_per_s,
                "wall_s": res.wall_s,
                "read_wait_s": res.extra["read_wait_s"],
                "host_outside_steps_s": res.extra["host_outside_steps_s"],
                "timed": summarise(timed, t_run),
                "setup_s": t_run - t_start,
            }
            report["rows"].append(out)
            tm = out["timed"]
            print(
                f"{row}: {res.tokens_per_s:.0f} tok/s, read_wait {out['read_wait_s']:.2f} s, host outside steps "
                f"{out['host_outside_steps_s']:.2f} s, reads {tm['reads']} median {tm['read_ms_median']:.1f} ms "
                f"p90 {tm['read_ms_p90']:.1f}, on the step thread {tm['reads_on_step_thread']}, claims "
                f"{json.dumps(tm['claims'])}, waits by second {json.dumps(tm['wait_s_by_second'])}",
                flush=True,
            )
            args.out.write_text(json.dumps(report, indent=1))  # after each row: a cut-off run keeps what it has
    return 0


if __name__ == "__main__":
    sys.exit(main())
