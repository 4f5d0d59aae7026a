"""`multilora economics`: size a multi-tenant LoRA fleet vs dedicated fine-tuned copies."""

from __future__ import annotations

import json

import typer


def command(
    tenants: int = typer.Option(..., "--tenants", help="Number of tenants, one adapter each."),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="Model preset (llama-2-7b, llama-3-8b, llama-3.1-8b, llama-3-70b, llama-3.2-1b, "
        "mistral-7b, qwen2.5-7b, gemma-2-9b, gemma-3-12b, phi-3-mini, phi-4, qwen3-30b-a3b), a HF model directory, "
        "or a Hub id. "
        "Default: the adapter's base model, "
        "else llama-2-7b.",
    ),
    rank: int | None = typer.Option(None, "--rank", help="LoRA rank (default 16)."),
    targets: str | None = typer.Option(
        None,
        "--targets",
        help="Comma-separated modules (q_proj,...,down_proj) or all / attn / mlp. Default q_proj,k_proj,v_proj,o_proj.",
    ),
    adapter: str | None = typer.Option(None, "--adapter", help="Take the adapter shape from a real PEFT adapter."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="bfloat16 | float16 | float32."),
    quantization: str = typer.Option(
        "none",
        "--quantization",
        help="none | fp8: the base's decoder projections in FP8, 1 byte each (as `run --quantization fp8`; an FP8 "
        "checkpoint counts as FP8 without it).",
    ),
    gpu: str = typer.Option("h100-sxm", "--gpu", help="h100-sxm | h200 | a100-80gb | a100-40gb | l40s | a10g."),
    gpu_memory_gb: float | None = typer.Option(None, "--gpu-memory-gb", help="Override the preset's memory (GB)."),
    gpu_bandwidth_tbs: float | None = typer.Option(None, "--gpu-bandwidth-tbs", help="Override HBM TB/s."),
    gpu_hour_usd: float | None = typer.Option(None, "--gpu-hour-usd", help="Override the $/GPU-hour."),
    pcie_gbs: float | None = typer.Option(None, "--pcie-gbs", help="Host->GPU copy GB/s (preset: Gen5 55, Gen4 25)."),
    bandwidth_efficiency: float = typer.Option(0.8, "--bandwidth-efficiency", help="Achieved fraction of peak."),
    kv_reserve: float = typer.Option(0.3, "--kv-reserve", help="Fraction of GPU memory kept for KV cache."),
    batch_size: int = typer.Option(64, "--batch-size", help="Decode batch (sequences per step), at most."),
    context_len: int = typer.Option(1024, "--context-len", help="Mean context tokens per sequence."),
    tokens_per_tenant_per_s: float = typer.Option(
        50.0, "--tokens-per-tenant-per-s", help="Sustained generated tokens/s each tenant needs."
    ),
    max_loras: int | None = typer.Option(
        None,
        "--max-loras",
        help="GPU adapter slots. Default: what `multilora "
        "run` allocates (engine/slot_budget.py): one per tenant while they fit half "
        "the memory left after the weights and the KV of --batch-size x --context-len.",
    ),
    popularity: str = typer.Option("uniform", "--popularity", help="uniform | zipf."),
    zipf_s: float = typer.Option(1.0, "--zipf-s", help="Zipf exponent s (with --popularity zipf)."),
    output_tokens: float | None = typer.Option(
        None, "--output-tokens", help="Mean generated tokens per request (default: measured, else 256)."
    ),
    requests_per_step: float | None = typer.Option(
        None, "--requests-per-step", help="New requests per decode step (default: batch / output tokens)."
    ),
    stats: str | None = typer.Option(
        None,
        "--stats",
        help="run_stats.json from `multilora run --stats`. Its tokens/s and step time size the "
        "fleet only when it ran the same model shape in the same dtype width on a CUDA GPU of the --gpu kind "
        "(a bare 'cuda:0' is taken as that GPU, with a warning); otherwise the roofline does and a warning on "
        "stderr says why. Its tokens per request and slot hit rate are used either way.",
    ),
    as_json: bool = typer.Option(False, "--json", metavar="", help="Print one JSON object instead of tables."),
    plot: str | None = typer.Option(
        None,
        "--plot",
        metavar="FILE",
        help="Also draw GPUs and $/month vs tenants (1 to 10x --tenants) and the slots' hit rate and loads per "
        "step to FILE (.png or .svg). Needs the plot extra: pip install 'multilora[plot]'.",
    ),
) -> int:
    """Adapter bytes, GPUs and dollars: dedicated full fine-tunes vs one shared base with LoRA slots.

    --stats: measured tok/s replace the roofline only for a run of the same
    model shape and dtype width on a CUDA GPU of the --gpu kind; a CPU run,
    another model or another GPU is shown for reference only.

    Under the tables, one sparkline per curve over tenants 1 to 10x --tenants.
    Results go to stdout, warnings to stderr.
    """
    from multilora_cli.economics import Scenario, analyze, render, resolve
    from multilora_cli.economics.curves import tenant_curves

    scenario = Scenario(
        tenants=tenants,
        model=model,
        rank=rank,
        targets=targets,
        adapter=adapter,
        dtype=dtype,
        quantization=quantization,
        gpu=gpu,
        gpu_memory_gb=gpu_memory_gb,
        gpu_bandwidth_tbs=gpu_bandwidth_tbs,
        gpu_hour_usd=gpu_hour_usd,
        pcie_gbs=pcie_gbs,
        bandwidth_efficiency=bandwidth_efficiency,
        kv_reserve=kv_reserve,
        batch_size=batch_size,
        context_len=context_len,
        tokens_per_tenant_per_s=tokens_per_tenant_per_s,
        max_loras=max_loras,
        popularity=popularity,
        zipf_s=zipf_s,
        output_tokens=output_tokens,
        requests_per_step=requests_per_step,
        stats=stats,
    )
    target = None
    if plot is not None:  # matplotlib and the file are checked before any work, as run checks its outputs
        from multilora_cli.plot.target import prepare_plot

        target = prepare_plot(plot)
    resolved = resolve(scenario)
    report = analyze(resolved)
    curves = tenant_curves(resolved, report) if target is not None or not as_json else None
    if target is not None:
        from multilora_cli.plot.economics import render_economics

        target.write(render_economics(curves, report, target.format))
    if as_json:
        # allow_nan=False: NaN / Infinity are not JSON; inputs are checked finite, so this only guards a bug
        typer.echo(json.dumps(report.to_dict(), indent=2, allow_nan=False))
        for w in report.warnings:  # also in the JSON; said on stderr too so a piped run still shows them
            typer.echo(f"warning: {w}", err=True)
    else:
        from multilora_cli.plot.terminal import economics_lines

        render(report, curves=economics_lines(curves))
    return 0
