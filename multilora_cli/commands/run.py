"""`multilora run`: JSONL prompts in, JSONL completions out, over many LoRA adapters on one base model."""

from __future__ import annotations

from typing import Optional

import typer

from multilora_cli.config import DEVICES, DTYPES
from multilora_cli.errors import UsageError


def split_items(values: list[str] | None) -> list[str]:
    """`-a legal,medical -a code=./c` -> ['legal', 'medical', 'code=./c'] (empty items dropped)."""
    out: list[str] = []
    for v in values or []:
        out.extend(s.strip() for s in v.split(",") if s.strip())
    return out


def command(
    input: str = typer.Argument(..., metavar="INPUT", help="JSONL file of requests, or - for stdin."),
    model: Optional[str] = typer.Option(None, "-m", "--model",
                                        help="Base model: local dir or HF id. Default: the adapters' base model."),
    adapters: Optional[list[str]] = typer.Option(None, "-a", "--adapters",
                                                 help="NAME=PATH or a path / HF id (its text is its name); "
                                                      "comma lists, repeatable."),
    adapter_dir: Optional[str] = typer.Option(None, "--adapter-dir",
                                              help="Add every subfolder holding an adapter_config.json."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Output JSONL (default: stdout)."),
    errors: Optional[str] = typer.Option(None, "--errors", help="Also copy error records to this file."),
    stats: Optional[str] = typer.Option(None, "--stats", help="Write run statistics JSON to this file."),
    resume: bool = typer.Option(False, "--resume", help="Keep the output's finished records; run only the rest."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Default max new tokens per request."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="Default temperature (0 = greedy)."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Default nucleus sampling p in (0, 1]."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Default top-k (0 = off)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Run seed: sampled lines without a seed derive theirs."),
    max_loras: Optional[int] = typer.Option(None, "--max-loras", help="Adapters resident on the GPU at once."),
    max_lora_rank: Optional[int] = typer.Option(None, "--max-lora-rank", help="Largest adapter rank to serve."),
    max_cpu_loras: Optional[int] = typer.Option(None, "--max-cpu-loras", help="Adapters cached in host memory."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="Sequences in flight per step."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help="Longest prompt + completion."),
    dtype: str = typer.Option("auto", "--dtype", help=f"One of {', '.join(DTYPES)}."),
    device: str = typer.Option("auto", "--device", help=f"One of {', '.join(DEVICES)}."),
    gpu_hour_usd: Optional[float] = typer.Option(None, "--gpu-hour-usd", help="GPU price, for the cost in stats."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar and no summary on stderr."),
    data_parallel: int = typer.Option(1, "--data-parallel",
                                      help="Worker processes on this machine, one per GPU (or N CPU workers); "
                                           "requests are sharded by adapter. Under torchrun leave it out."),
) -> int:
    """Run every line of INPUT through the base model or its adapter; write one record per line, in order.

    Exit codes: 0 all lines ok, 3 finished with some error records, 1 fatal, 2 usage.
    """
    from multilora_cli.runjob import RunConfig, run_job

    for flag, value in (("--max-loras", max_loras), ("--max-lora-rank", max_lora_rank),
                        ("--max-cpu-loras", max_cpu_loras), ("--max-num-seqs", max_num_seqs),
                        ("--max-model-len", max_model_len)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if device not in DEVICES:
        raise UsageError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    cfg = RunConfig(
        input=input, model=model, adapters=split_items(adapters), adapter_dir=adapter_dir, output=output,
        errors=errors, stats=stats, resume=resume,
        sampling={"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k},
        seed=seed, max_loras=max_loras, max_lora_rank=max_lora_rank, gpu_hour_usd=gpu_hour_usd, quiet=quiet,
        engine={"dtype": dtype, "device": device, "max_cpu_loras": max_cpu_loras, "max_num_seqs": max_num_seqs,
                "max_model_len": max_model_len},
        data_parallel=data_parallel,
    )
    return run_job(cfg)
