"""Where the engine's host time in `Scheduler.schedule` + `postprocess` goes on the GPU host, per bench_e2e row.

    python3 benchmarks/profile_host.py --rows base,64,64w --out $OUT/profile-host.txt

Runs bench_e2e rows (Llama-3-8B shapes, 1024 x (128 + 128) unless told otherwise; `64w` = the 64-adapter row
with its adapters read and packed before timing, `--host-warm`;
any bench_e2e row spec works, e.g. `256/64`) with cProfile switched on only inside
schedule() / postprocess(), and prints each row's `schedule_s` with the functions that took it. The profiler
slows those calls, so compare rows with each other, not with bench_e2e's numbers. What it separates: if
`schedule_s` of the 64-adapter row falls to the base row's with the adapters packed ahead (64w), the extra
host time comes from packing that runs during the steps (GIL or CPU contention), not from the scheduler.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
from pathlib import Path

import torch

from multilora_cli.bench.model_dir import write_model_dir
from multilora_cli.bench.plan import parse_rows
from multilora_cli.bench.roofline import measure_bandwidth
from multilora_cli.bench.suite import run_multilora_row
from multilora_cli.bench.workload import Workload
from multilora_cli.engine.scheduler import Scheduler

PROFILE = cProfile.Profile()


def profiled(fn):
    def wrapper(*args, **kwargs):
        PROFILE.enable()
        try:
            return fn(*args, **kwargs)
        finally:
            PROFILE.disable()

    return wrapper


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="llama-3-8b")
    p.add_argument("--rows", default="base,64,64w")
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (use --preset tiny)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    Scheduler.schedule = profiled(Scheduler.schedule)
    Scheduler.postprocess = profiled(Scheduler.postprocess)
    device = torch.device(args.device)
    bw = measure_bandwidth(device)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(args.preset, Path(tmp) / "model")
        for row in args.rows.split(","):
            warm = row.endswith("w")
            ((kind, work),) = parse_rows(row.rstrip("w"), Workload(preset=args.preset, num_requests=args.requests))
            n = work.num_adapters if kind != "base" else 0
            global PROFILE
            PROFILE = cProfile.Profile()  # one profile per row (the wrappers look the name up per call)
            res = run_multilora_row(work, model_dir, device, bandwidth=bw, base_only=n == 0, host_warm=warm)
            s = io.StringIO()
            pstats.Stats(PROFILE, stream=s).sort_stats("cumulative").print_stats(args.top)
            head = (
                f"== row {row}: {res.tokens_per_s:.0f} tok/s, schedule_s {res.extra['schedule_s']:.3f} "
                f"(profiled, warm-up included below), host outside steps {res.extra['host_outside_steps_s']:.3f}"
                f", read_wait_s {res.extra['read_wait_s']:.3f}, install_host_s {res.extra['install_host_s']:.3f}"
            )
            print(head, flush=True)
            lines += [head, s.getvalue()]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines[1::2])[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
