"""End-to-end A/B in one process: bench_e2e rows, each run once per arm, arms interleaved per row and repeated
(benchmarks/ab_run_ahead.py, benchmarks/ab_sampler.py)."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from multilora_cli.bench.model_dir import write_model_dir
from multilora_cli.bench.plan import parse_rows
from multilora_cli.bench.roofline import measure_bandwidth
from multilora_cli.bench.suite import run_multilora_row
from multilora_cli.bench.workload import Workload


def parser(
    description: str, rows: str, temperature: float = 0.0, top_p: float = 1.0, rank: int = 16
) -> argparse.ArgumentParser:
    """The options every end-to-end A/B script takes (what `run_arms` reads); scripts add their own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--preset", default="llama-3-8b")
    p.add_argument("--rows", default=rows)
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--temperature", type=float, default=temperature, help="above 0: seeded sampling, else greedy")
    p.add_argument("--top-p", type=float, default=top_p)
    p.add_argument("--rank", type=int, default=rank, help="LoRA rank of every adapter")
    p.add_argument("--max-num-seqs", type=int, default=256, help="sequences per decode step at most")
    p.add_argument("--budget-s", type=float, default=None, help="start no row after this many seconds")
    p.add_argument("--out", type=Path, required=True)
    return p


def run_arms(
    args, arms: dict[str, Callable[[], None]], extra: Callable[[dict], dict] | None = None, command: str = ""
) -> dict:
    """For each repeat, row of `args.rows` and arm: `arms[arm]()` (switch the engine to it), then one bench_e2e
    row; the report (device, bandwidth, command, rows) is rewritten to `args.out` after each row, so a run cut
    off by `args.budget_s` or a timeout keeps what it measured. `extra(res.extra)` adds fields to a row.
    args: what `parser` defines."""
    t_start = time.time()
    device = torch.device("cuda")
    bw = measure_bandwidth(device)
    report = {"device": torch.cuda.get_device_name(), "bandwidth_tbs": bw / 1e12, "command": command, "rows": []}
    base = Workload(
        preset=args.preset,
        num_requests=args.requests,
        temperature=args.temperature,
        top_p=args.top_p,
        rank=args.rank,
        max_num_seqs=args.max_num_seqs,
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(args.preset, Path(tmp) / "model")
        for rep in range(args.repeats):
            for spec in args.rows.split(","):
                ((kind, work),) = parse_rows(spec, base)
                for arm, switch in arms.items():
                    if args.budget_s is not None and time.time() - t_start > args.budget_s:
                        report["cut_at"] = {"repeat": rep, "row": spec, "arm": arm}
                        args.out.write_text(json.dumps(report, indent=1))
                        return report
                    switch()
                    res = run_multilora_row(
                        work, model_dir, device, bandwidth=bw, base_only=kind == "base", log=lambda *a: None
                    )
                    e = res.extra
                    row = {
                        "repeat": rep,
                        "row": spec,
                        "arm": arm,
                        "tok_s": round(res.tokens_per_s, 1),
                        "decode_step_ms": round(res.decode_step_ms, 3),
                        "decode_batch": res.decode_batch,
                        "decode_s": round(e["decode_s"], 3),
                        "prefill_s": round(e["prefill_s"], 3),
                        **(extra(e) if extra else {}),
                    }
                    report["rows"].append(row)
                    print(json.dumps(row), flush=True)
                    args.out.write_text(json.dumps(report, indent=1))
    return report
