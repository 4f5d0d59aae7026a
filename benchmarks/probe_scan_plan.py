"""Probe: startup cost per adapter of validating it from its header and planning its direct read (CPU only).

    python3 benchmarks/probe_scan_plan.py --adapters 64 --out benchmarks/results/scan-plan-<host>.json

`multilora run` scans every adapter in pre-flight (adapters/scan.scan_adapter), then the engine plans each
adapter's read at start (engine/direct_read.plan_read). Before session 10 the engine scanned each adapter a
second time; now it plans from pre-flight's scan. Three arms per repetition over the same Llama-3-8B-shaped
PEFT folders (rank 16, all 7 projections; files in the page cache): the scan alone, a plan that scans again,
a plan from the scan. Reports ms per adapter (min and median over repetitions).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, as the other benchmarks do
from multilora_cli.adapters.scan import scan_adapter  # noqa: E402
from multilora_cli.bench.adapters import SyntheticAdapters  # noqa: E402
from multilora_cli.bench.model_dir import write_model_dir  # noqa: E402
from multilora_cli.engine.direct_read import plan_read  # noqa: E402
from multilora_cli.models.config import ModelConfig  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--adapters", type=int, default=64)
    p.add_argument("--preset", default="llama-3-8b")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="probe_scan_"))
    cfg = ModelConfig.from_dir(write_model_dir(args.preset, root / "model"))
    names = [f"a{i}" for i in range(args.adapters)]
    sa = SyntheticAdapters(cfg, names, 16, max_distinct=1)  # one weight set, hard-linked: the same bytes
    sa.prepare(torch.bfloat16, torch.device("cpu"))
    paths, n = sa.paths, len(names)
    arms: dict[str, list[float]] = {"scan": [], "plan, scanning again": [], "plan from the scan": []}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        scans = {a: scan_adapter(paths[a], a, cfg) for a in names}
        t1 = time.perf_counter()
        for a in names:
            plan_read(paths[a], a, cfg, torch.bfloat16)
        t2 = time.perf_counter()
        for a in names:
            plan_read(paths[a], a, cfg, torch.bfloat16, scan=scans[a])
        t3 = time.perf_counter()
        for arm, dt in zip(arms, (t1 - t0, t2 - t1, t3 - t2)):
            arms[arm].append(dt / n * 1e3)
    rows = {arm: {"min_ms": round(min(v), 3), "median_ms": round(statistics.median(v), 3)} for arm, v in arms.items()}
    report = {
        "host": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "preset": args.preset,
        "adapters": n,
        "repeats": args.repeats,
        "per_adapter": rows,
        "command": " ".join(["python3", *sys.argv]),
    }
    for arm, r in rows.items():
        print(f"{arm:>22}: {r['min_ms']:.2f} ms min, {r['median_ms']:.2f} ms median per adapter")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
