"""`multilora run`: JSONL prompts in, JSONL completions out, over many LoRA adapters on one base model."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Optional

import typer

from multilora_cli.config import DEVICES, DTYPES, GPU_MEMORY_UTILIZATION, QUANTIZATIONS

if TYPE_CHECKING:
    from multilora_cli.run.config import RunConfig

# Typer checks these choices (exit 2 with its usage message); members are named and valued as the strings
Dtype = Enum("Dtype", [(d, d) for d in DTYPES], type=str)
Device = Enum("Device", [(d, d) for d in DEVICES], type=str)
Quantization = Enum("Quantization", [(q, q) for q in QUANTIZATIONS], type=str)


def split_items(values: list[str] | None) -> list[str]:
    """`-a legal,medical -a code=./c` -> ['legal', 'medical', 'code=./c'] (empty items dropped)."""
    out: list[str] = []
    for v in values or []:
        out.extend(s.strip() for s in v.split(",") if s.strip())
    return out


_GEN = "Default: the model's generation_config.json, else "  # sampling flags only fill in what a line leaves out


def _opt(default, *names: str, metavar: str, help: str, **more):
    """A typer option with an explicit metavar ("" for flags: typer would otherwise print <bool>). `more`: e.g.
    Typer's min= / max=, checked as the flag is parsed (a usage error, exit 2)."""
    return typer.Option(default, *names, metavar=metavar, help=help, **more)


def run_job(cfg: RunConfig) -> int:
    """Run `cfg` to completion; returns the exit code (0 / 3). Fatal problems raise MultiloraError.

    With cfg.data_parallel > 1, or when started by torchrun with several processes, the run is spread over
    workers by multilora_cli.distributed (rank 0 runs the job; see distributed/launch.py); else one RunJob runs
    it in this process. The choice is made here, above both, so distributed/ imports run/ and not the reverse."""
    from multilora_cli.distributed.group import torchrun_env
    from multilora_cli.io.terminal import stop_on_next_signal

    distributed = cfg.data_parallel > 1 or torchrun_env() is not None
    try:
        if distributed:
            from multilora_cli.distributed.launch import run_distributed

            return run_distributed(cfg)
        from multilora_cli.run.job import RunJob

        return RunJob(cfg).run()
    except KeyboardInterrupt:  # (also when it came before generation: pre-flight, model load, --resume checks)
        stop_on_next_signal(force=not distributed)  # a data-parallel run still has its workers to stop
        raise


def command(
    input: str = typer.Argument(..., metavar="INPUT", help="JSONL file of requests, or - for stdin."),
    model: Optional[str] = _opt(
        None,
        "-m",
        "--model",
        metavar="MODEL",
        help="Base model: local dir or HF id. Default: the adapters' base model.",
    ),
    adapters: Optional[list[str]] = _opt(
        None,
        "-a",
        "--adapters",
        metavar="LIST",
        help="NAME=PATH or a path / HF id (a path is named by its folder, a Hub "
        "id by itself); comma lists, repeatable.",
    ),
    adapter_dir: Optional[str] = _opt(
        None,
        "--adapter-dir",
        metavar="DIR",
        help="Add every subfolder holding an adapter_config.json, named by the folder.",
    ),
    output: Optional[str] = _opt(None, "-o", "--output", metavar="PATH", help="Output JSONL. Default: stdout."),
    errors: Optional[str] = _opt(None, "--errors", metavar="PATH", help="Also copy error records to this file."),
    stats: Optional[str] = _opt(None, "--stats", metavar="PATH", help="Write run statistics JSON to this file."),
    resume: bool = _opt(
        False,
        "--resume",
        metavar="",
        help="Keep the -o file's finished records (checked against INPUT); run only the rest.",
    ),
    max_tokens: Optional[int] = _opt(
        None,
        "--max-tokens",
        metavar="N",
        help="Max new tokens per line (a line's own value wins). " + _GEN + "256.",
        min=1,
    ),
    temperature: Optional[float] = _opt(
        None, "--temperature", metavar="T", help="Temperature, 0 = greedy (a line's own value wins). " + _GEN + "0."
    ),
    top_p: Optional[float] = _opt(
        None, "--top-p", metavar="P", help="Nucleus sampling p in (0, 1] (a line's own value wins). " + _GEN + "1."
    ),
    top_k: Optional[int] = _opt(
        None, "--top-k", metavar="K", help="Top-k, 0 = off (a line's own value wins). " + _GEN + "0.", min=0
    ),
    min_p: Optional[float] = _opt(
        None,
        "--min-p",
        metavar="P",
        help="Min-p in [0, 1], 0 = off (transformers' MinPLogitsWarper; a line's own value wins). " + _GEN + "0.",
        min=0,
        max=1,
    ),
    repetition_penalty: Optional[float] = _opt(
        None,
        "--repetition-penalty",
        metavar="R",
        help="transformers' repetition penalty > 0 over prompt and output, 1 = off (a line's own value wins). "
        + _GEN
        + "1.",
        min=0,
    ),
    frequency_penalty: Optional[float] = _opt(
        None,
        "--frequency-penalty",
        metavar="F",
        help="OpenAI's frequency penalty in [-2, 2] (a line's own value wins). Default: 0.",
        min=-2,
        max=2,
    ),
    presence_penalty: Optional[float] = _opt(
        None,
        "--presence-penalty",
        metavar="F",
        help="OpenAI's presence penalty in [-2, 2] (a line's own value wins). Default: 0.",
        min=-2,
        max=2,
    ),
    min_tokens: Optional[int] = _opt(
        None,
        "--min-tokens",
        metavar="N",
        help="No eos or stop before N new tokens (a line's own value wins). " + _GEN + "0.",
        min=0,
    ),
    seed: Optional[int] = _opt(
        None,
        "--seed",
        metavar="S",
        help="Run seed: sampled lines without a seed derive theirs from it and the line. Default: 0.",
    ),
    max_loras: Optional[int] = _opt(
        None,
        "--max-loras",
        metavar="N",
        help="Adapters resident in GPU slots at once. Default: on a GPU one per "
        "adapter while they fit half the memory left after the weights and a KV "
        "reserve for --max-num-seqs (the summary says why); on CPU at most 8.",
        min=1,
    ),
    max_lora_rank: Optional[int] = _opt(
        None,
        "--max-lora-rank",
        metavar="R",
        help="Largest adapter rank to serve. Default: the adapters' largest rank.",
        min=1,
    ),
    max_cpu_loras: Optional[int] = _opt(
        None,
        "--max-cpu-loras",
        metavar="N",
        help="Adapters cached in host memory. Default: all that fit a quarter of host memory (at least --max-loras).",
        min=1,
    ),
    max_num_seqs: Optional[int] = _opt(
        None, "--max-num-seqs", metavar="N", help="Sequences in flight per step. Default: 256.", min=1
    ),
    max_model_len: Optional[int] = _opt(
        None,
        "--max-model-len",
        metavar="N",
        help="Longest prompt + completion, in tokens. Default: the model's "
        "max_position_embeddings (capped by the KV cache).",
        min=1,
    ),
    gpu_memory_utilization: float = _opt(
        GPU_MEMORY_UTILIZATION,
        "--gpu-memory-utilization",
        metavar="F",
        help="Share of the GPU's memory the run may use (weights, slots, KV cache). Default: 0.9.",
        show_default=False,  # the help says it
    ),
    pinned_arena: bool = _opt(
        True,
        "--pinned-arena/--no-pinned-arena",
        metavar="",
        help="CUDA: keep host-cached adapters in page-locked memory registered once at "
        "start (asynchronous slot loads; costs ~0.3 s per GiB at start, at most a "
        "quarter of RAM). Off: pageable memory.",
    ),
    prefix_cache: bool = _opt(
        True,
        "--prefix-cache/--no-prefix-cache",
        metavar="",
        help="Reuse the KV of prompt prefixes already computed under the same adapter (by content) and run "
        "requests sharing a prefix together. Off: every prompt is computed in full, in arrival order.",
    ),
    dtype: Dtype = _opt(Dtype.auto, "--dtype", metavar="DTYPE", help=f"One of {', '.join(DTYPES)}."),
    device: Device = _opt(Device.auto, "--device", metavar="DEVICE", help=f"One of {', '.join(DEVICES)}."),
    quantization: Quantization = _opt(
        Quantization.none,
        "--quantization",
        metavar="Q",
        help="fp8: run the base's decoder projections in FP8 (e4m3, per-channel scales, dynamic per-token "
        "activations), quantized while loading; LoRA stays in the compute dtype. FP8 checkpoints "
        "(compressed-tensors, fbgemm_fp8) are FP8 without it.",
    ),
    gpu_hour_usd: Optional[float] = _opt(
        None,
        "--gpu-hour-usd",
        metavar="USD",
        help="GPU price per hour, for the cost in stats (total and per 1M tokens).",
        min=0,
    ),
    quiet: bool = _opt(False, "-q", "--quiet", metavar="", help="No progress bar and no summary on stderr."),
    data_parallel: int = _opt(
        1,
        "--data-parallel",
        metavar="N",
        help="Worker processes on this machine, one per GPU (or N CPU workers); requests are "
        "sharded by adapter. Under torchrun leave it out.",
        min=1,
    ),
) -> int:
    """Run every line of INPUT through the base model or its adapter; write one record per line, in order.

    Exit codes: 0 all lines ok, 3 finished with some error records, 1 fatal, 2 usage.
    """
    from multilora_cli.io.sampling import SamplingFlags
    from multilora_cli.io.terminal import guard_stderr, ignore_signals_at_exit
    from multilora_cli.run.config import EngineFlags, RunConfig

    guard_stderr()  # before anything is said on stderr: a closed or vanished stderr must not stop the run
    cfg = RunConfig(
        input=input,
        model=model,
        adapters=split_items(adapters),
        adapter_dir=adapter_dir,
        output=output,
        errors=errors,
        stats=stats,
        resume=resume,
        sampling=SamplingFlags(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            min_tokens=min_tokens,
        ),
        seed=seed,
        max_loras=max_loras,
        max_lora_rank=max_lora_rank,
        gpu_hour_usd=gpu_hour_usd,
        quiet=quiet,
        engine=EngineFlags(
            dtype=dtype.value,
            device=device.value,
            max_cpu_loras=max_cpu_loras,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            pinned_arena=pinned_arena,
            quantization=quantization.value,
            prefix_cache=prefix_cache,
        ),
        data_parallel=data_parallel,
    )
    try:
        return run_job(cfg)
    finally:
        ignore_signals_at_exit()  # the run is over: a signal during the exit must not print a traceback
