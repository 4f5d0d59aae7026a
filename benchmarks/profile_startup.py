"""Host start-up with many adapters (issue 38): what a run pays per adapter before its first step.

    python -m benchmarks.profile_startup --adapters 1000 --preset tiny --device cpu --out /tmp/startup.json
    python -m benchmarks.profile_startup --adapters 1000 --preset llama-3.2-1b --out $OUT/startup.json   # GPU

Writes N synthetic PEFT adapters (bench/adapters.py; `--distinct-weights` files, the rest hard-linked), then
times the phases that touch every adapter: pre-flight (adapters/preflight.py: config + header scan of each),
read plans (engine/direct_read.plan_read, what Engine._make_arena does per adapter on a GPU), the engine's own
start (model, KV; on a GPU the pinned arena), and reading + packing every adapter into the host cache
(`SlotManager.warm`). Each phase is reported in total and per 1,000 adapters; run it at two counts (e.g. 500 and
2,000) to see that the per-1,000 figure stays flat (linear, not superlinear, in the adapters).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks.timing import command_line, parser, save_report
from multilora_cli.adapters.preflight import preflight
from multilora_cli.bench.adapters import SyntheticAdapters, SyntheticEngine
from multilora_cli.bench.model_dir import write_model_dir
from multilora_cli.bench.suite import engine_config
from multilora_cli.bench.workload import Workload
from multilora_cli.engine.direct_read import plan_read
from multilora_cli.models.config import ModelConfig


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--adapters", type=int, default=1000)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--distinct-weights", type=int, default=1000)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None)
    p.add_argument("--no-host-cache", action="store_true", help="skip reading every adapter (large shapes on CPU)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="multilora-startup-"))
    model_dir = write_model_dir(args.preset, tmp / "model")
    cfg = ModelConfig.from_dir(model_dir)
    n = args.adapters
    work = Workload(preset=args.preset, num_adapters=n, max_loras=min(n, 64), rank=args.rank, max_num_seqs=64)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    phases: dict[str, float] = {}

    t = time.perf_counter()
    source = SyntheticAdapters(cfg, work.adapter_names, args.rank, max_distinct=args.distinct_weights)
    source.prepare(dtype, device)
    phases["write_s"] = time.perf_counter() - t

    t = time.perf_counter()
    pf = preflight({k: str(v) for k, v in source.paths.items()}, str(model_dir))
    phases["preflight_s"] = time.perf_counter() - t
    assert not pf.errors, next(iter(pf.errors.values()))

    t = time.perf_counter()
    for name, path in source.paths.items():
        plan_read(path, name, cfg, dtype, scan=pf.scans[name])
    phases["read_plans_s"] = time.perf_counter() - t

    econf = engine_config(work, model_dir, device)
    econf.max_cpu_loras = n
    t = time.perf_counter()
    engine = SyntheticEngine(econf, source, cfg)
    phases["engine_s"] = time.perf_counter() - t
    try:
        if not args.no_host_cache:
            t = time.perf_counter()
            for name in work.adapter_names:
                engine.slots.warm(name)
            phases["host_cache_s"] = time.perf_counter() - t
    finally:
        engine.close()
    report = {
        "command": command_line("benchmarks.profile_startup", argv),
        "preset": args.preset,
        "device": str(device),
        "adapters": n,
        "adapter_bytes": source.nbytes,
        "phases": phases,
        "per_1000_adapters_s": {k: v * 1000 / n for k, v in phases.items()},
    }
    for k, v in phases.items():
        print(f"{k:>14}: {v:8.2f} s   {v * 1000 / n:8.2f} s per 1,000 adapters")
    if args.out:
        save_report(report, Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
