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

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from multilora_cli.bench.model_dir import write_model_dir  # noqa: E402
from multilora_cli.bench.plan import parse_rows  # noqa: E402
from multilora_cli.bench.roofline import measure_bandwidth  # noqa: E402
from multilora_cli.bench.suite import run_multilora_row  # noqa: E402
from multilora_cli.bench.workload import Workload  # noqa: E402
from multilora_cli.engine import engine as engine_mod  # noqa: E402
from multilora_cli.engine import scheduler as sched_mod  # noqa: E402

AHEAD_STEPS: list[int] = []


def count_ahead_steps() -> None:
    """Record each scheduler's ahead-step count when its engine's generate() ends."""
    generate = engine_mod.Engine.generate

    def counted(self, *a, **kw):
        try:
            yield from generate(self, *a, **kw)
        finally:
            AHEAD_STEPS.append(self.scheduler.num_ahead_steps)

    engine_mod.Engine.generate = counted
    assert sched_mod.Scheduler.schedule_ahead  # the feature this script measures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="llama-3-8b")
    p.add_argument("--rows", default="base,64,256/64")
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--temperature", type=float, default=0.0, help="above 0: seeded sampling instead of greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--budget-s", type=float, default=None, help="start no row after this many seconds")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    count_ahead_steps()
    t_start = time.time()
    device = torch.device("cuda")
    bw = measure_bandwidth(device)
    report = {"device": torch.cuda.get_device_name(), "bandwidth_tbs": bw / 1e12, "command": " ".join(sys.argv),
              "rows": []}
    base = Workload(preset=args.preset, num_requests=args.requests, temperature=args.temperature, top_p=args.top_p)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(args.preset, Path(tmp) / "model")
        for rep in range(args.repeats):
            for spec in args.rows.split(","):
                ((kind, work),) = parse_rows(spec, base)
                for arm in ("sync", "ahead"):
                    if args.budget_s is not None and time.time() - t_start > args.budget_s:
                        report["cut_at"] = {"repeat": rep, "row": spec, "arm": arm}
                        args.out.write_text(json.dumps(report, indent=1))
                        return 0
                    engine_mod.RUN_AHEAD = arm == "ahead"
                    res = run_multilora_row(work, model_dir, device, bandwidth=bw, base_only=kind == "base",
                                            log=lambda *a: None)
                    e = res.extra
                    row = {"repeat": rep, "row": spec, "arm": arm, "tok_s": round(res.tokens_per_s, 1),
                           "decode_step_ms": round(res.decode_step_ms, 3), "decode_batch": res.decode_batch,
                           "decode_s": round(e["decode_s"], 3), "prefill_s": round(e["prefill_s"], 3),
                           "host_outside_steps_s": round(e["host_outside_steps_s"], 3),
                           "ahead_steps": AHEAD_STEPS[-1], "decode_steps": e["decode_steps"]}
                    report["rows"].append(row)
                    print(json.dumps(row), flush=True)
                    args.out.write_text(json.dumps(report, indent=1))  # after each row: a cut-off run keeps it
    engine_mod.RUN_AHEAD = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
