"""A/B of the engine running each next decode step ahead (engine.RUN_AHEAD) against one step at a time.

    python3 benchmarks/ab_run_ahead.py --rows base,64,256/64 --repeats 2 --out $OUT/ab-run-ahead.json

bench_e2e rows (Llama-3-8B shapes, random weights, 1024 x (128 + 128), greedy or --temperature sampled,
ignore_eos) in ONE process, the two arms interleaved per row and repeated: "sync" reads each step's ids back
before the next is planned; "ahead" plans and launches the next decode step first (Scheduler.schedule_ahead).
Per row: tok/s, the median decode step at the common batch size, decode and prefill seconds, host time outside
the steps, ahead steps.
Run a throwaway process first (Triton cache), as for bench_e2e.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from multilora_cli.bench.ab import parser, run_arms  # noqa: E402
from multilora_cli.engine import engine as engine_mod  # noqa: E402
from multilora_cli.engine import scheduler as sched_mod  # noqa: E402

AHEAD_STEPS: list[int] = []


def count_ahead_steps() -> None:
    """Record the ahead steps of each generate() call (the scheduler's count also holds the warm-up's)."""
    generate = engine_mod.Engine.generate

    def counted(self, *a, **kw):
        before = self.scheduler.num_ahead_steps
        try:
            yield from generate(self, *a, **kw)
        finally:
            AHEAD_STEPS.append(self.scheduler.num_ahead_steps - before)

    engine_mod.Engine.generate = counted
    assert sched_mod.Scheduler.schedule_ahead  # the feature this script measures


def main() -> int:
    p = parser(__doc__.splitlines()[0], "base,64,256/64")
    args = p.parse_args()
    count_ahead_steps()

    def arm(ahead: bool):
        def switch():
            engine_mod.RUN_AHEAD = ahead

        return switch

    def extra(e: dict) -> dict:
        return {
            "host_outside_steps_s": round(e["host_outside_steps_s"], 3),
            "ahead_steps": AHEAD_STEPS[-1],
            "decode_steps": e["decode_steps"],
        }

    try:
        run_arms(args, {"sync": arm(False), "ahead": arm(True)}, extra, command=" ".join(sys.argv))
    finally:
        engine_mod.RUN_AHEAD = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
