"""`multilora demo [OUT_DIR] [--force]`: build the bundled demo (tiny trained Llama + 3 PEFT adapters + inputs)."""

from __future__ import annotations

from pathlib import Path

import typer

NEXT = "cd {out} && multilora run prompts.jsonl --adapters legal,medical --stats stats.json"


def command(
    out_dir: Path = typer.Argument(
        Path("demo"), metavar="OUT_DIR", help="Folder to build the demo in (created if missing)."
    ),
    force: bool = typer.Option(
        False, "--force", metavar="", help="Rebuild even if OUT_DIR is not empty (replaces only the demo's own files)."
    ),
) -> int:
    """Build a small Llama base model and legal/medical/code LoRA adapters, offline, in about 30 s on CPU."""
    from multilora_cli.demo.build import build_demo, is_demo

    if is_demo(out_dir) and not force:
        typer.echo(f"demo already built in {out_dir}/ (pass --force to rebuild it)")
        typer.echo(f"next: {NEXT.format(out=out_dir)}")
        return 0
    summary = build_demo(out_dir, force=force, log=lambda line: typer.echo(line, err=True))
    typer.echo(
        f"demo built in {out_dir}/ in {summary['seconds']:.1f} s: base/ (Llama, HF layout), legal/ medical/ "
        "code/ (PEFT adapters), prompts.jsonl, openai_batch.jsonl"
    )
    typer.echo(f"next: {NEXT.format(out=out_dir)}")
    return 0
