"""Where does a decode step's time go? Profiles one full-batch decode step of the e2e workload.

    python -m benchmarks.profile_decode --preset llama-3-8b --adapters 64      # and --adapters 0 (base)
    python -m benchmarks.profile_decode --adapters 64 --phase prefill          # the first full prefill step
    python -m benchmarks.profile_decode --preset qwen3-30b-a3b --adapters 16 --distinct-weights 4 --phase prefill
    python -m benchmarks.profile_decode --preset qwen3-30b-a3b --adapters 16 --distinct-weights 4 --phase mixed

Prefill also reports the host time to queue the eager step on an idle device, the threads that used the CPU
meanwhile (a step loop slowed by its neighbours, or by its own work) and a cProfile of it by function;
`mixed` does the same for the first step of a full batch that is neither decode-only nor a full chunk: a wave's
last prompt tokens beside the decodes of the rest (max_num_seqs sequences in all), run eagerly (no CUDA graph
holds a mixed step).

Runs the benchmark workload until a decode step of max_num_seqs sequences, then re-runs that same step
(re-running a decode step rewrites the same KV slot with the same values, so nothing changes): host wall time
of the graph step, GPU time of the graph replay alone (events), host time of the step's metadata build, and a
torch.profiler kernel table of the same step run eagerly (the GPU work inside the graph, kernel by kernel).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.timing import event_times_ms, parser, wall_times_s


def thread_cpu_ns() -> dict[int, int]:
    """CPU time of each of this process's threads so far (Linux schedstat, ns), by native thread id."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    return out


def busy_threads(before: dict[int, int], wall_s: float) -> None:
    """Threads that used the CPU since `before` (a step loop slowed by its neighbours: which ones, how much)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    used = []
    for tid, ns in thread_cpu_ns().items():
        dt = ns - before.get(tid, 0)
        if dt > 0.01 * wall_s * 1e9:
            name = names.get(tid)
            if name is None:
                try:
                    with open(f"/proc/self/task/{tid}/comm") as f:
                        name = f"[{f.read().strip()}]"
                except OSError:
                    name = "[?]"
            used.append((dt, name))
    used.sort(reverse=True)
    shown = ", ".join(f"{name} {dt / 1e9 / wall_s:.0%}" for dt, name in used[:12])
    print(f"  threads busy over those {wall_s:.2f} s (CPU / wall): {shown}")


def main() -> int:
    import torch

    from multilora_cli.bench.adapters import SyntheticAdapters, SyntheticEngine
    from multilora_cli.bench.model_dir import write_model_dir
    from multilora_cli.bench.suite import engine_config
    from multilora_cli.bench.workload import Workload
    from multilora_cli.models.config import ModelConfig

    ap = parser(__doc__)
    ap.add_argument("--preset", default="llama-3-8b")
    ap.add_argument("--adapters", type=int, default=64)
    ap.add_argument("--at-step", type=int, default=40, help="profile the n-th full-batch decode step")
    ap.add_argument("--rows", type=int, default=30, help="kernel table rows")
    ap.add_argument("--phase", choices=("decode", "prefill", "mixed"), default="decode")
    ap.add_argument(
        "--distinct-weights", type=int, default=64, help="distinct adapter weight files (hard links for the rest)"
    )
    args = ap.parse_args()
    dev = torch.device("cuda")
    work = Workload(
        preset=args.preset,
        num_adapters=args.adapters,
        num_requests=256,
        output_len=96,
        max_loras=max(1, min(args.adapters, 64)),
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(args.preset, Path(tmp) / "m")
        cfg = ModelConfig.from_dir(model_dir)
        source = (
            SyntheticAdapters(cfg, work.adapter_names, work.rank, max_distinct=args.distinct_weights)
            if args.adapters
            else None
        )
        if source is not None:
            source.prepare(torch.bfloat16, dev)  # PEFT folders, before the engine starts
        # one step at a time (run-ahead off: same tokens), so re-running a step finds nothing else in flight
        engine = SyntheticEngine(replace(engine_config(work, model_dir, dev), run_ahead=False), source, cfg)
        runner = engine.runner
        real_launch = runner.launch
        real_run = lambda batch: runner.collect(real_launch(batch))  # noqa: E731
        seen = {"n": 0, "done": False}

        def launch(batch, prev=None):
            # the step loop launches and collects (Runner.launch / collect); the hook sits on launch
            if args.phase != "decode":
                full_chunk = batch.num_tokens >= work.max_num_batched_tokens
                # prefill: a full chunk; mixed: a full batch of sequences in fewer tokens than a chunk
                wanted = (
                    full_chunk if args.phase == "prefill" else (not full_chunk and batch.num_seqs == work.max_num_seqs)
                )
                if not seen["done"] and not batch.is_decode_only and wanted:
                    seen["done"] = True
                    real_run(batch)
                    profile_eager(batch)
                    raise SystemExit(0)  # nothing more to see: skip the rest of the workload
            elif not seen["done"] and batch.is_decode_only and batch.num_seqs == work.max_num_seqs:
                seen["n"] += 1
                if seen["n"] == args.at_step:
                    seen["done"] = True
                    real_run(batch)
                    profile(batch)
            return real_launch(batch, prev)

        def profile_eager(batch):
            for _ in range(2):
                real_run(batch)
            torch.cuda.synchronize()
            walls = wall_times_s(lambda: real_run(batch), 5, sync=True)
            gpus = event_times_ms(lambda: real_run(batch), 5)
            print(
                f"{args.phase} step: {batch.num_seqs} seqs, {batch.num_tokens} tokens, "
                f"{len({s for s in batch.slots if s >= 0})} adapters"
            )
            print(
                f"  step wall (runner.run): {statistics.median(walls) * 1e3:.2f} ms, "
                f"events around it: {statistics.median(gpus):.2f} ms"
            )
            enqueue_profile(batch)
            kernel_table(lambda: real_run(batch))

        def enqueue_profile(batch):
            # host time to queue the eager step on an idle device (nothing else running on the host), then where it
            # goes by function: what the step loop pays before the device can run the whole step
            def timed():
                torch.cuda.synchronize()
                t = time.perf_counter()
                done = real_launch(batch)
                dt = time.perf_counter() - t
                runner.collect(done)
                return dt

            before, t0 = thread_cpu_ns(), time.perf_counter()
            print(
                f"  enqueue (runner.launch, idle device): {statistics.median(timed() for _ in range(5)) * 1e3:.2f} ms"
            )
            busy_threads(before, time.perf_counter() - t0)
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            prof.enable()
            done = real_launch(batch)
            prof.disable()
            runner.collect(done)
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.rows)
            print("  host functions of one enqueue (cProfile, by own time):")
            print("\n".join("    " + line for line in out.getvalue().splitlines() if line.strip()))

        def kernel_table(step):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
            events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
            total = sum(e.self_device_time_total for e in events) / 3 / 1e3
            print(f"  kernels, GPU time per step: {total:.2f} ms in {sum(e.count for e in events) // 3} kernels")
            events.sort(key=lambda e: -e.self_device_time_total)
            for e in events[: args.rows]:
                print(f"    {e.self_device_time_total / 3 / 1e3:7.3f} ms  {e.count // 3:5d}x  {e.key[:110]}")

        def profile(batch):
            g = runner.graphs
            for _ in range(3):
                real_run(batch)
            walls = wall_times_s(lambda: real_run(batch), 20)  # the step reads its ids back: it waits itself
            bs = g.bucket(batch.num_seqs)
            replay = statistics.median(event_times_ms(g.graphs[bs].replay, 20))
            slots = batch.token_lora_slots() if any(s >= 0 for s in batch.slots) else None

            def fill():
                g._fill(batch, bs)
                if g.lora_buffers is not None:
                    g.lora_buffers.build((slots or [-1] * batch.num_seqs) + [-1] * (bs - batch.num_seqs))

            hosts = wall_times_s(fill, 20)
            torch.cuda.synchronize()
            kv = sum(batch.seq_lens())
            print(
                f"decode step: {batch.num_seqs} seqs, {kv} context tokens, "
                f"{len({s for s in batch.slots if s >= 0})} adapters"
            )
            print(f"  graph step wall (runner.run): {statistics.median(walls) * 1e3:.2f} ms")
            print(f"  graph replay GPU time:        {replay:.2f} ms")
            print(f"  host fill + LoRA meta build:  {statistics.median(hosts) * 1e3:.2f} ms")
            runner.graphs = None
            try:
                for _ in range(2):
                    real_run(batch)
                torch.cuda.synchronize()
                print("  eager run of the same step:")
                kernel_table(lambda: real_run(batch))
            finally:
                runner.graphs = g

        runner.launch = launch
        if args.phase != "decode":  # adapters in their slots first: else admissions wait on reads, steps stay small
            for name in work.adapter_names[: work.max_loras]:  # (past the slots, a load would evict an earlier one)
                engine.slots.acquire(name)
        engine.generate_all(work.requests(cfg.vocab_size))
        engine.close()
    if not seen["done"]:
        raise SystemExit(f"no {args.phase} step of the workload matched (full batch / full chunk): nothing profiled")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
