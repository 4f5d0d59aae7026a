"""A/B of the sort-free sampling kernel (kernels/sample.py) against the same sampling definition in torch ops
(a [B, V] sort per step), end to end in the engine.

    python3 benchmarks/ab_sampler.py --rows base,64 --repeats 2 --out $OUT/ab-sampler.json

bench_e2e rows (Llama-3-8B shapes, random weights, 1024 x (128 + 128), seeded sampling at --temperature and
--top-p, ignore_eos, run-ahead on) in ONE process, the two arms interleaved per row and repeated:
"torch" runs `Sampler`'s torch path on the GPU logits, "triton" its kernel; the LoRA and attention kernels are
the same in both. Per row: tok/s, the median decode step at the common batch size, decode and prefill seconds.
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
from multilora_cli.engine import sampler as sampler_mod  # noqa: E402
from multilora_cli.kernels import use_triton  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="llama-3-8b")
    p.add_argument("--rows", default="base,64")
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--budget-s", type=float, default=None, help="start no row after this many seconds")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.temperature <= 0:
        p.error("--temperature must be > 0: greedy rows do not sample")
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
                for arm in ("torch", "triton"):
                    if args.budget_s is not None and time.time() - t_start > args.budget_s:
                        report["cut_at"] = {"repeat": rep, "row": spec, "arm": arm}
                        args.out.write_text(json.dumps(report, indent=1))
                        return 0
                    # the sampler module's own name: the LoRA layers keep theirs (Triton on CUDA) in both arms
                    sampler_mod.use_triton = use_triton if arm == "triton" else (lambda t: False)
                    res = run_multilora_row(work, model_dir, device, bandwidth=bw, base_only=kind == "base",
                                            log=lambda *a: None)
                    e = res.extra
                    row = {"repeat": rep, "row": spec, "arm": arm, "tok_s": round(res.tokens_per_s, 1),
                           "decode_step_ms": round(res.decode_step_ms, 3), "decode_batch": res.decode_batch,
                           "decode_s": round(e["decode_s"], 3), "prefill_s": round(e["prefill_s"], 3)}
                    report["rows"].append(row)
                    print(json.dumps(row), flush=True)
                    args.out.write_text(json.dumps(report, indent=1))  # after each row: a cut-off run keeps it
    sampler_mod.use_triton = use_triton
    return 0


if __name__ == "__main__":
    sys.exit(main())
