"""Per-step log of bench_e2e rows: every step's kind, sequences, tokens, distinct adapters and host seconds.

    PYTHONPATH=. python3 benchmarks/probe_step_log.py 256/256,256/64      # writes $OUT/steps.json

The rows' summaries (tok/s, decode step) are what bench_e2e.py reports; the step logs show where a row's time
goes when the summary alone does not (session 13: the 256-slot row's admissions starved by slow adapter loads).
"""

import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multilora_cli.bench import suite  # noqa: E402
from multilora_cli.bench.model_dir import write_model_dir  # noqa: E402
from multilora_cli.bench.plan import parse_rows  # noqa: E402
from multilora_cli.bench.roofline import measure_bandwidth  # noqa: E402
from multilora_cli.bench.workload import Workload  # noqa: E402


def main() -> int:
    logs: dict[str, list] = {}
    summarise = suite._summarise

    def keep(work, steps, roof, system, out, wall):
        logs[f"{work.num_adapters}/{work.max_loras}"] = [asdict(s) for s in steps]
        return summarise(work, steps, roof, system, out, wall)

    suite._summarise = keep
    dev = torch.device("cuda")
    base = Workload(preset="llama-3-8b")
    with tempfile.TemporaryDirectory() as d:
        model_dir = write_model_dir("llama-3-8b", Path(d) / "model")
        bw = measure_bandwidth(dev)
        for kind, w in parse_rows(sys.argv[1] if len(sys.argv) > 1 else "256/256,256/64", base):
            row = suite.run_multilora_row(w, model_dir, dev, bandwidth=bw, base_only=kind == "base")
            print(json.dumps({k: v for k, v in asdict(row).items() if k != "workload"})[:600], flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "steps.json"), "w") as f:
        json.dump(logs, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
