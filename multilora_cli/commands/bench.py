"""`multilora bench`: size your own GPU with the end-to-end benchmark (the workload of benchmarks.bench_e2e)."""

from __future__ import annotations

import typer

from multilora_cli.config import FP8_SMALL_M


def command(
    preset: str = typer.Option(
        "llama-3-8b",
        "--preset",
        "-p",
        help="Model shape: llama-3-8b, llama-3.1-8b, "
        "llama-3.2-1b, llama-2-7b, llama-3-70b, mistral-7b, qwen2.5-7b, gemma-2-9b, gemma-3-12b, phi-3-mini, "
        "phi-4, qwen3-30b-a3b (MoE: adapters on attention + experts), tiny. Random weights: no download.",
    ),
    num_adapters: str | None = typer.Option(
        None, "--num-adapters", help="Adapter counts to run, comma-separated (8,64). Default 64."
    ),
    max_loras: int | None = typer.Option(
        None, "--max-loras", help="GPU slots, >= 1 (default: multilora run's, sized from GPU memory and the adapters)."
    ),
    distinct_weights: int = typer.Option(
        64,
        "--distinct-weights",
        help="Distinct adapter files written; the others hard-link them (read from the OS page cache).",
    ),
    rank: int = typer.Option(16, "--rank", help="LoRA rank, on all 7 projections."),
    distribution: str | None = typer.Option(
        None, "--distribution", help="uniform (default) | zipf spread over adapters."
    ),
    requests: int = typer.Option(1024, "--requests", "-n", help="Requests per row."),
    prompt_len: int = typer.Option(128, "--prompt-len", help="Prompt tokens per request."),
    output_len: int = typer.Option(128, "--output-len", help="Generated tokens per request (eos ignored)."),
    max_num_seqs: int = typer.Option(256, "--max-num-seqs", help="Largest decode batch."),
    temperature: float = typer.Option(
        0.0, "--temperature", help="0 = greedy; above 0: seeded sampling (HF + PEFT rows sample too)."
    ),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass (with --temperature)."),
    base: bool | None = typer.Option(
        None, "--base/--no-base", metavar="", help="Also run the base model without adapters (default: yes)."
    ),
    hf: bool | None = typer.Option(
        None,
        "--hf/--no-hf",
        metavar="",
        help="Also time HF transformers + PEFT (slow to "
        "build: minutes at 8B with 64 adapters; timed on a few tokens and extrapolated).",
    ),
    rows: str | None = typer.Option(
        None,
        "--rows",
        help="Advanced: row specs instead of the flags above, e.g. "
        "64,base,hf64,256/64,64z (see multilora_cli/bench/plan.py).",
    ),
    quantization: str = typer.Option(
        "none",
        "--quantization",
        help="none | fp8, or both (none,fp8): every row once per value, side by side in one process; fp8 runs the "
        "base's decoder projections in FP8 (random weights drawn FP8: a 70B base never exists in bf16).",
    ),
    fp8_small_m: int = typer.Option(
        FP8_SMALL_M,
        "--fp8-small-m",
        help="Advanced, FP8: steps of at least this many tokens run cuBLAS _scaled_mm, smaller ones the Triton "
        "kernel (python -m benchmarks.bench_gemm --fp8 measures the crossing).",
    ),
    device: str = typer.Option("auto", "--device", help="auto | cuda | cpu (cpu: use --preset tiny)."),
    json_path: str | None = typer.Option(None, "--json", help="Also write the full report (JSON) here."),
    plot: str | None = typer.Option(
        None,
        "--plot",
        metavar="FILE",
        help="Also draw tokens/s per row (base only as a line) and each decode step against its roofline to FILE "
        "(.png or .svg). Needs the plot extra: pip install 'multilora[plot]'.",
    ),
) -> int:
    """Tokens/s of multilora with adapters, base only (and HF + PEFT), with each decode step against the roofline:
    base weights + live KV + distinct adapters read once per step, at the bandwidth measured on this GPU.
    Under the table, one sparkline per curve: tokens/s, decode step and roofline per row."""
    import math
    import tempfile
    from dataclasses import replace
    from pathlib import Path

    import torch

    from multilora_cli.bench.model_dir import PRESETS, write_model_dir
    from multilora_cli.bench.plan import parse_rows
    from multilora_cli.bench.report import format_table, write_json
    from multilora_cli.bench.suite import run_suite
    from multilora_cli.bench.workload import Workload
    from multilora_cli.config import DEVICES, QUANTIZATIONS
    from multilora_cli.engine.device import resolve_device
    from multilora_cli.errors import MultiloraError, UsageError
    from multilora_cli.paths import expand_user

    # every flag is checked (Workload names the flag in its errors) before the device: a typo is a usage error,
    # not a "no GPU here"
    if device not in DEVICES:
        raise UsageError(f"--device must be {', '.join(DEVICES[:-1])} or {DEVICES[-1]}, got {device!r}")
    for flag, value in (("--temperature", temperature), ("--top-p", top_p)):
        if not math.isfinite(value):  # NaN and inf pass SamplingParams' comparisons
            raise UsageError(f"{flag} must be a finite number, got {value}")
    if rows is not None:  # each row spec sets these itself: a flag beside it would be ignored without a word
        given = [
            f
            for f, v in (
                ("--num-adapters", num_adapters),
                ("--distribution", distribution),
                ("--max-loras", max_loras),
                ("--base/--no-base", base),
                ("--hf/--no-hf", hf),
            )
            if v is not None
        ]
        if given:
            raise UsageError(
                f"--rows sets adapters, slots, spread and systems per row; drop {', '.join(given)}",
                hint="e.g. --rows 64/8z,base,hf64 for 64 adapters in 8 slots, zipf, plus base and HF",
            )
    distribution = distribution or "uniform"
    work = Workload(
        preset=preset,
        rank=rank,
        max_loras=max_loras,
        num_requests=requests,
        prompt_len=prompt_len,
        output_len=output_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(8192, max_num_seqs),
        distribution=distribution,
        temperature=temperature,
        top_p=top_p,
        fp8_small_m=fp8_small_m,
        distinct_weights=distinct_weights,
    )
    shape = PRESETS[work.preset.strip().lower()]
    if prompt_len + output_len > shape.get("max_position_embeddings", 2048):  # else every row fails after the load
        raise UsageError(
            f"--prompt-len {prompt_len} + --output-len {output_len} exceed the {preset} shape's "
            f"{shape.get('max_position_embeddings', 2048)} positions"
        )
    if rank > shape["hidden_size"]:  # a LoRA delta's rank is at most min(in, out) <= hidden: more only costs memory
        raise UsageError(f"--rank {rank} is above the {preset} shape's hidden size {shape['hidden_size']}")
    if json_path:
        _check_writable(Path(json_path), UsageError)
    target = None
    if plot is not None:  # matplotlib and the file are checked before minutes of benchmark, not after
        from multilora_cli.plot.target import prepare_plot

        target = prepare_plot(plot)
        if json_path and expand_user(json_path).resolve() == expand_user(plot).resolve():
            raise UsageError(f"--json and --plot name the same file {plot}; give each its own")
    if rows is None:
        specs = []
        for n in (s.strip() for s in (num_adapters or "64").split(",") if s.strip()):
            if not n.isdigit():
                raise UsageError(f"--num-adapters takes counts like 8,64; got {n!r}")
            slots = f"/{max_loras}" if max_loras is not None else ""
            specs.append(f"{n}{slots}{'z' if distribution == 'zipf' else ''}")
            if hf:
                specs.append(f"hf{n}")
        if base is not False:  # default: yes
            specs.append("base")
        rows = ",".join(specs)
    quants = [q.strip() for q in quantization.split(",") if q.strip()]
    bad = [q for q in quants if q not in QUANTIZATIONS]
    if bad or not quants or len(set(quants)) < len(quants):
        raise UsageError(
            f"--quantization takes {', '.join(QUANTIZATIONS)} (comma-separated for both), got {quantization!r}"
        )
    # HF + PEFT rows run the bf16 base only: once, not once per quantization
    plan = [
        (kind, w)
        for i, q in enumerate(quants)
        for kind, w in parse_rows(rows, replace(work, quantization=q))
        if kind != "hf" or q == "none" or (i == 0 and "none" not in quants)
    ]
    device = resolve_device(device)
    if device == "cpu" and work.preset.strip().lower() != "tiny":
        raise UsageError(
            f"no GPU here: a {preset} benchmark on CPU would take hours",
            hint="run it on a GPU, or try the pipeline with --device cpu --preset tiny",
        )
    dev = torch.device(device)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir(preset, Path(tmp) / "model")
        report = run_suite(
            plan, model_dir, dev, hf_batch_sizes=[max_num_seqs, 4 * max_num_seqs], log=lambda m: typer.echo(m, err=True)
        )
    if json_path:
        write_json(report, Path(json_path))
    typer.echo(format_table(report))
    from multilora_cli.bench.series import bench_series
    from multilora_cli.plot.terminal import bench_lines

    series = bench_series(report)
    for line in bench_lines(series):
        typer.echo(line)
    if target is not None:
        from multilora_cli.plot.bench import render_bench

        target.write(render_bench(series, target.format))
    if report["failed"]:  # the table lists them; the exit code tells a script
        first = report["failed"][0]
        raise MultiloraError(
            f"{len(report['failed'])} of {len(plan)} benchmark rows failed (first: {first['kind']} "
            f"{first['workload']['num_adapters']} adapters: {first['error']})"
        )
    return 0


def _check_writable(path, error) -> None:
    """Refuse a --json path that cannot be written before minutes of benchmark, not after: create its folders
    (write_json would) and open it for appending, removing the empty file again if it was not there."""
    if path.is_dir():
        raise error(f"--json {path} is a directory", hint="give a file path, e.g. bench.json")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with open(path, "a"):
            pass
        if not existed:
            path.unlink()
    except OSError as e:
        raise error(f"--json {path} cannot be written: {e.strerror or e}") from None
