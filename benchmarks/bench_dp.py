"""Data-parallel benchmark: one `multilora run` over 2 GPUs vs 1, and per-GPU adapter loads with vs without
adapter affinity (round-robin sharding as the baseline).

    python -m benchmarks.bench_dp --out $OUT/dp-h200x2.json            # 2-GPU machine
    python -m benchmarks.bench_dp --device cpu --preset tiny --requests 96 --prompt-len 16 \
        --output-len 8 --rank 8 --out /tmp/dp-cpu.json                  # CPU smoke run

Workload: a Llama-3.2-1B-shaped model with random weights (EngineConfig.load_format="dummy": config.json and
a tokenizer only), 64 rank-16 PEFT adapters on q,k,v,o written to disk, requests of --prompt-len words and
--output-len new tokens (greedy), adapters drawn zipf (or uniform). Each row is a fresh process running the
real `run` path (run_job(RunConfig) — reader, pre-flight, sharding, engines, ordered writer) and its --stats
JSON is read back: tokens/s over generation seconds (engines built, so model load and CUDA graph capture are
out) and over wall seconds, per-worker tokens/s, adapters assigned and slot loads. A warm-up row first fills
the Triton cache so no timed row compiles kernels. Rows: dp1, dp2 affinity, dp2 round-robin.
Writes JSON to --out and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.timing import command_line, parser, save_report

ROOT = Path(__file__).resolve().parents[1]  # the repository root: the row processes run `-m` from there


def build_workload(work: Path, a) -> tuple[Path, Path, list[str]]:
    """Model dir (config + tokenizer), adapters on disk, the input JSONL."""
    import numpy as np
    import torch

    from multilora_cli.bench.model_dir import write_model_dir
    from multilora_cli.demo.layout import write_adapter
    from multilora_cli.models.config import ModelConfig

    model = write_model_dir(a.preset, work / "model")
    cfg = ModelConfig.from_dir(model)
    targets = a.targets.split(",")
    names = [f"lora{i}" for i in range(a.adapters)]
    g = torch.Generator().manual_seed(0)
    for name in names:
        lora = {}
        for layer in range(cfg.num_hidden_layers):
            for m in targets:
                fin, fout = cfg.linear_shape(m)
                part = "mlp" if m in ("gate_proj", "up_proj", "down_proj") else "self_attn"
                lora[f"model.layers.{layer}.{part}.{m}"] = (
                    torch.randn(a.rank, fin, generator=g) * fin**-0.5,
                    torch.randn(fout, a.rank, generator=g) * 0.05,
                    2.0,
                )
        write_adapter(
            work / "adapters" / name, model, lora, r=a.rank, alpha=2 * a.rank, targets=targets, use_rslora=False
        )
    rng = np.random.default_rng(a.seed)
    if a.distribution == "zipf":
        p = 1.0 / np.arange(1, a.adapters + 1) ** a.zipf_s
        idx = rng.choice(a.adapters, a.requests, p=p / p.sum())
    else:
        idx = rng.integers(0, a.adapters, a.requests)
    vocab = cfg.vocab_size
    inp = work / "in.jsonl"
    with open(inp, "w") as f:
        for i, k in enumerate(idx):
            words = " ".join(f"w{w}" for w in rng.integers(10, vocab, a.prompt_len))
            f.write(json.dumps({"id": i, "prompt": words, "adapter": names[k], "max_tokens": a.output_len}) + "\n")
    return model, inp, names


def run_row(spec: dict) -> int:
    """One row in this process: the real run path with dummy weights."""
    from multilora_cli.commands.run import run_job
    from multilora_cli.run.config import EngineFlags, RunConfig

    cfg = RunConfig(
        input=spec["input"],
        model=spec["model"],
        adapter_dir=spec["adapter_dir"],
        output=spec["output"],
        stats=spec["stats"],
        quiet=True,
        max_loras=spec["max_loras"],
        max_lora_rank=spec["rank"],
        data_parallel=spec["dp"],
        dp_sharding=spec["sharding"],
        engine=EngineFlags(
            load_format="dummy",
            device=spec["device"],
            dtype=spec["dtype"],
            max_num_seqs=spec["max_num_seqs"],
            max_model_len=spec["max_model_len"],
            max_cpu_loras=spec["max_cpu_loras"],
        ),
    )
    return run_job(cfg)


def summarize_row(name: str, spec: dict, stats: dict, seconds: float) -> dict:
    dp = stats.get("data_parallel") or {}
    workers = [
        {
            k: w.get(k)
            for k in (
                "rank",
                "device",
                "requests",
                "prompt_tokens",
                "completion_tokens",
                "tokens_per_second",
                "wall_seconds",
                "assigned_adapters",
                "slot_loads",
                "slot_evictions",
                "load_seconds",
            )
        }
        for w in dp.get("workers", [])
    ]
    if not workers:  # one process: the engine's own numbers
        e = stats["engine"]
        workers = [
            {
                "rank": 0,
                "device": e.get("device"),
                "requests": e.get("requests"),
                "prompt_tokens": e.get("prompt_tokens"),
                "completion_tokens": e.get("completion_tokens"),
                "tokens_per_second": e.get("tokens_per_second"),
                "wall_seconds": e.get("wall_seconds"),
                "assigned_adapters": sum(1 for n, a in stats["per_adapter"].items() if n != "base"),
                "slot_loads": e.get("slot_loads"),
                "slot_evictions": e.get("slot_evictions"),
            }
        ]
    return {
        "row": name,
        "data_parallel": spec["dp"],
        "sharding": spec["sharding"] if spec["dp"] > 1 else None,
        "requests": stats["requests"],
        "errors": stats["errors"],
        "total_tokens": stats["total_tokens"],
        "completion_tokens": stats["completion_tokens"],
        "generation_seconds": stats["generation_seconds"],
        "wall_seconds": stats["wall_seconds"],
        "process_seconds": round(seconds, 2),
        "tokens_per_second": stats["tokens_per_second"],
        "wall_tokens_per_second": stats["total_tokens"] / stats["wall_seconds"],
        "slot_loads": stats["slot_loads"],
        "slot_evictions": stats["slot_evictions"],
        "adapters_split": dp.get("adapters_split"),
        "workers": workers,
    }


def table(rows: list[dict]) -> str:
    out = [
        "| row | GPUs | sharding | tok/s (generation) | tok/s (wall) | per-worker tok/s | adapters per worker "
        "| slot loads per worker |",
        "|---|---:|---|---:|---:|---|---|---|",
    ]
    for r in rows:
        w = r["workers"]
        per = ", ".join(format(x["tokens_per_second"], ",.0f") for x in w)
        out.append(
            f"| {r['row']} | {r['data_parallel']} | {r['sharding'] or '-'} | {r['tokens_per_second']:,.0f} "
            f"| {r['wall_tokens_per_second']:,.0f} | {per} "
            f"| {', '.join(str(x['assigned_adapters']) for x in w)} "
            f"| {', '.join(str(x['slot_loads']) for x in w)} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--out", help="JSON results path (required)")
    ap.add_argument("--preset", default="llama-3.2-1b")
    ap.add_argument("--adapters", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--distribution", choices=("zipf", "uniform"), default="zipf")
    ap.add_argument("--zipf-s", type=float, default=1.0)
    ap.add_argument("--max-loras", type=int, default=16, help="GPU slots per worker")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--rows", default="dp1,dp2-affinity,dp2-round-robin")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--row", help=argparse.SUPPRESS)  # internal: run one row (JSON spec) in this process
    a = ap.parse_args(argv)
    if a.row:
        return run_row(json.loads(a.row))
    if not a.out:
        ap.error("--out is required")

    import torch

    if a.device == "cuda" and torch.cuda.device_count() < a.gpus:
        print(f"bench_dp: needs {a.gpus} GPUs, {torch.cuda.device_count()} visible", file=sys.stderr)
        return 1
    device_name = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
    with tempfile.TemporaryDirectory(prefix="bench-dp-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        model, inp, names = build_workload(work, a)
        setup = time.perf_counter() - t0
        print(f"bench_dp: workload ready in {setup:.1f} s ({a.requests} requests, {a.adapters} adapters)", flush=True)
        base = {
            "input": str(inp),
            "model": str(model),
            "adapter_dir": str(work / "adapters"),
            "max_loras": a.max_loras,
            "rank": a.rank,
            "device": a.device,
            "dtype": "bfloat16" if a.device == "cuda" else "float32",
            "max_num_seqs": a.max_num_seqs,
            "max_model_len": a.prompt_len + a.output_len + 16,
            "max_cpu_loras": max(a.adapters, a.max_loras),
        }
        plan = {
            "dp1": (1, "affinity"),
            "dp2-affinity": (a.gpus, "affinity"),
            "dp2-round-robin": (a.gpus, "round-robin"),
        }
        rows, results = [], {}
        warm = work / "warm.jsonl"  # the first 64 lines: compiles the Triton kernels before any timed row
        warm.write_text("".join(inp.read_text().splitlines(keepends=True)[:64]))
        for name in ["warmup", *a.rows.split(",")]:
            dp, sharding = plan.get(name, (1, "affinity"))
            spec = {
                **base,
                "dp": dp,
                "sharding": sharding,
                "output": str(work / f"{name}.jsonl"),
                "stats": str(work / f"{name}.json"),
                **({"input": str(warm)} if name == "warmup" else {}),
            }
            t1 = time.perf_counter()
            res = subprocess.run(
                [sys.executable, "-m", "benchmarks.bench_dp", "--row", json.dumps(spec)], cwd=ROOT, timeout=540
            )
            secs = time.perf_counter() - t1
            if res.returncode != 0:
                print(f"bench_dp: row {name} failed (exit {res.returncode})", file=sys.stderr, flush=True)
                results[name] = {"row": name, "failed": res.returncode}
                continue
            stats = json.loads(Path(spec["stats"]).read_text())
            if name == "warmup":
                continue
            results[name] = row = summarize_row(name, spec, stats, secs)
            rows.append(row)
            print(
                f"bench_dp: {name}: {row['tokens_per_second']:,.0f} tok/s, loads per worker "
                f"{[w['slot_loads'] for w in row['workers']]}",
                flush=True,
            )
        same = None
        outs = [work / f"{r['row']}.jsonl" for r in rows]
        if len(outs) > 1:  # greedy: the same records whatever the sharding, up to bf16 batch-order effects
            texts = [p.read_text().splitlines() for p in outs]
            same = sum(all(t[i] == texts[0][i] for t in texts) for i in range(len(texts[0]))) / len(texts[0])
    one, aff, rr = (results.get(k, {}) for k in ("dp1", "dp2-affinity", "dp2-round-robin"))
    report = {
        "device": device_name,
        "command": command_line("benchmarks.bench_dp"),
        "gpus": a.gpus,
        "torch": torch.__version__,
        "setup_seconds": round(setup, 1),
        "workload": {
            k: getattr(a, k)
            for k in (
                "preset",
                "adapters",
                "rank",
                "targets",
                "requests",
                "prompt_len",
                "output_len",
                "distribution",
                "zipf_s",
                "max_loras",
                "max_num_seqs",
                "seed",
            )
        },
        "rows": rows,
        "speedup_dp2_vs_dp1": (
            aff["tokens_per_second"] / one["tokens_per_second"]
            if "tokens_per_second" in aff and "tokens_per_second" in one
            else None
        ),
        "wall_speedup_dp2_vs_dp1": (
            aff["wall_tokens_per_second"] / one["wall_tokens_per_second"]
            if "wall_tokens_per_second" in aff and "wall_tokens_per_second" in one
            else None
        ),
        "loads_per_worker": {
            "affinity": [w["slot_loads"] for w in aff.get("workers", [])],
            "round_robin": [w["slot_loads"] for w in rr.get("workers", [])],
        },
        "identical_records_fraction": same,
        "failed_rows": [k for k, v in results.items() if "failed" in v],
    }
    save_report(report, a.out)
    print(table(rows))
    print(f"speedup (generation tok/s, dp2 affinity / dp1): {report['speedup_dp2_vs_dp1']}")
    return 1 if report["failed_rows"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
