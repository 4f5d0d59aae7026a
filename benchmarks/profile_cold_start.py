"""What a one-shot `multilora run` pays before and around its work: phase times of a fresh process.

    TRITON_CACHE_DIR=$(mktemp -d) python -m benchmarks.profile_cold_start --out $OUT/cold.json
    python -m benchmarks.profile_cold_start --out $OUT/warm.json     # the same TRITON_CACHE_DIR again: warm

Phases: imports (torch, triton, the engine), the dummy-weight engine (model build, KV cache, the parallel Triton
precompile of engine/precompile.py, CUDA-graph capture, pinned host arena), then the same workload twice
(`generate_all`, fresh adapters each time). The first pass includes every Triton compile the run needs (none
with a warm TRITON_CACHE_DIR); the second is the steady state, so first - second is what compiling mid-run
costs. Also counts the kernels Triton compiled in each pass. The engine captures its decode graphs as `run`
does, lazily inside the steps (`--eager-capture`: all at start, as before), and `ttft_s` is a run's time to its
first sampled token: imports + engine start + the first pass's first step (this tool's writing of the model
and adapter folders is left out). Weights are random (no checkpoint read:
a real 8B model adds its load time). `triton_*` fields: Triton's own count of compiles and cache loads, with the
seconds inside `triton.compile` (kernels/compile_log.py), at engine start and in each pass.

The demo job (issue 36: <= 12 s cold, <= 4 s warm), as a user runs it, each run a fresh process
(benchmarks/cold_start_demo.py; builds DIR with `multilora demo` first if it has no prompts.jsonl):

    python -m benchmarks.profile_cold_start --demo demo --runs cold,warm,warm --out $OUT/demo-start.json

Per run: wall_s, process_s (process start -> engine start: imports, pre-flight), engine_s, precompile_s,
capture_s, first_step_s (process start -> first step's ids), triton_at_start / triton_in_steps (compiled vs
loaded) and the cache entries it added, `kernels` (the path that ran: "triton" on CUDA) and `imports` (the run's
own import seconds split into torch_s / triton_s / rest_s, with the largest of the rest); plus import times of
fresh processes (python, torch, torch + triton, the run path's modules).
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks.timing import command_line, parser, save_report  # noqa: E402
from multilora_cli.bench.adapters import SyntheticAdapters, SyntheticEngine  # noqa: E402
from multilora_cli.bench.model_dir import write_model_dir  # noqa: E402
from multilora_cli.bench.suite import engine_config  # noqa: E402
from multilora_cli.bench.workload import Workload  # noqa: E402
from multilora_cli.kernels.compile_log import compile_log  # noqa: E402
from multilora_cli.models.config import ModelConfig  # noqa: E402

IMPORT_S = time.perf_counter() - T0


def compiled_count() -> int:
    """Kernels in Triton's disk cache: a fresh cache grows by one directory per compile."""
    root = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    return len(os.listdir(root)) if os.path.isdir(root) else 0


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--preset", default="llama-3-8b")
    p.add_argument("--adapters", type=int, default=64)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--device", default="cuda")
    p.add_argument("--eager-capture", action="store_true", help="capture every decode graph at start")
    p.add_argument("--out", required=True)
    p.add_argument("--demo", metavar="DIR", help="profile the demo job in DIR instead (fresh processes)")
    p.add_argument("--runs", default="cold,warm,warm", help="--demo: cold / warm runs, in order")
    p.add_argument("--job-args", default="", help="--demo: extra `multilora run` flags, e.g. '--device cpu'")
    args = p.parse_args()
    if args.demo:
        from benchmarks.cold_start_demo import profile_demo

        report = profile_demo(Path(args.demo), args.runs.split(","), args.job_args.split())
        report.update(command=command_line("benchmarks.profile_cold_start"), torch=torch.__version__)
        report["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        save_report(report, args.out)
        return 0
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    work = Workload(
        preset=args.preset,
        num_adapters=args.adapters,
        max_loras=min(args.adapters, 64),
        rank=16,
        distribution="uniform",
        num_requests=args.requests,
        prompt_len=args.prompt_len,
        output_len=args.output_len,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        seed=0,
    )
    report = dict(
        device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        triton=triton.__version__,
        command=command_line("benchmarks.profile_cold_start"),
        import_s=round(IMPORT_S, 2),
        cache_entries_at_start=compiled_count(),
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(args.preset, Path(tmp) / "model")
        cfg = ModelConfig.from_dir(model_dir)
        names = work.adapter_names + [f"second{i}" for i in range(args.adapters)]
        source = SyntheticAdapters(cfg, names, work.rank, seed=0)
        source.prepare(torch.bfloat16 if device.type == "cuda" else torch.float32, device)  # PEFT folders
        t = time.perf_counter()
        ecfg = replace(engine_config(work, model_dir, device), lazy_capture=not args.eager_capture)
        engine = SyntheticEngine(ecfg, source, cfg)
        sync()
        report.update(
            ready_s=round(time.perf_counter() - T0, 2),
            engine_s=round(time.perf_counter() - t, 2),
            capture_s=round(engine.runner.capture_seconds, 2),
            arena_s=round(engine.arena_seconds, 2),
            precompile_s=round(engine.runner.precompile_seconds, 2),
            precompiled=engine.runner.precompiled,
            **engine.runner.triton_counts(),  # triton_at_start (triton_in_steps: per pass below)
        )
        report.pop("triton_in_steps", None)
        log = compile_log()
        for i, tag in enumerate(("first", "second")):
            reqs = work.requests(cfg.vocab_size) if i == 0 else replace(work, seed=1).requests(cfg.vocab_size)
            if i:
                for j, r in enumerate(reqs):
                    r.adapter = f"second{j % args.adapters}"
            before, logged = compiled_count(), log.snapshot()
            engine.runner.step_log = []
            t = time.perf_counter()
            engine.generate_all(reqs)
            sync()
            report[f"{tag}_pass_s"] = round(time.perf_counter() - t, 2)
            if i == 0:
                # a run's first token: imports, the engine, its first step (not this tool's model and adapter
                # writing, which a user's run does not do)
                report["ttft_s"] = round(IMPORT_S + report["engine_s"] + engine.runner.step_log[0].seconds, 2)
                report["capture_in_first_pass_s"] = round(engine.runner.capture_seconds - report["capture_s"], 2)
            report[f"{tag}_pass_compiles"] = compiled_count() - before
            if log.supported:
                report[f"{tag}_pass_triton"] = log.since(logged)
        engine.close()
    report["wall_s"] = round(time.perf_counter() - T0, 2)
    print(json.dumps(report), flush=True)
    save_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
