"""Rich rendering of an `InspectReport` for humans (stdout); `--json` uses `InspectReport.to_json` instead."""

from __future__ import annotations

import os

from multilora_cli.adapters.report import InspectReport

PIPE_WIDTH = 160  # columns when stdout is not a terminal and COLUMNS is unset


def _num(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:g}" if float(x) != int(x) or abs(x) < 1e6 else f"{int(x):,}"


def _span(d: dict, label: str) -> str:
    lo, hi = d.get("min"), d.get("max")
    if lo is None:
        return "? (set per module by patterns; see the error)"
    return _num(lo) if lo == hi else f"{_num(lo)} - {_num(hi)} ({label})"


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e6:.2f} MB ({n:,} bytes)" if n >= 1e5 else f"{n / 1e3:.1f} kB ({n:,} bytes)"


def _targets(t) -> str:
    if t is None:
        return "(not set)"
    if isinstance(t, str):
        return f"regex {t!r}" if t != "all-linear" else "all-linear"
    leaves = sorted({x.rsplit(".", 1)[-1] for x in t})
    return ", ".join(t) if len(t) <= 8 else f"{len(t)} module names ({', '.join(leaves)})"


def render(rep: InspectReport, console=None) -> None:
    """Print the summary, the per-module table and the verdict."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if console is None:
        console = Console(soft_wrap=False)
        if not console.is_terminal and not os.environ.get("COLUMNS"):  # piped: rich would wrap at 80 columns
            console = Console(soft_wrap=False, width=PIPE_WIDTH)
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column(overflow="fold")

    def add(key: str, value: str) -> None:
        summary.add_row(key, escape(value))  # values (paths, lists) may hold "[...]", which is rich markup

    add("adapter", rep.source if rep.source == rep.path else f"{rep.source} ({rep.path})")
    base = rep.base_model or "(not named in adapter_config.json)"
    check = (
        f"shapes checked against {rep.checked_against}"
        if rep.checked_against
        else f"shapes not checked ({rep.check_note + '; ' if rep.check_note else ''}pass --model to check)"
    )
    add("base model", f"{base}; {check}")
    if rep.base_quantization:
        add("base weights", f"{rep.base_quantization}; the adapter runs in the compute dtype on top")
    add("type", rep.peft_type + (f", task {rep.task_type}" if rep.task_type else ""))
    add("rank", _span(rep.rank, "rank_pattern"))
    add("alpha", _span(rep.alpha, "alpha_pattern"))
    add("scaling", _span(rep.scaling, "per module") + (" (rsLoRA: alpha/sqrt(r))" if rep.use_rslora else " (alpha/r)"))
    add("rsLoRA", "yes" if rep.use_rslora else "no")
    add("target modules", _targets(rep.target_modules))
    if rep.modules_adapted:
        add("modules adapted", ", ".join(rep.modules_adapted))
    if rep.layers:
        of = f" of {rep.num_layers}" if rep.num_layers else ""
        add("layers", f"{layer_ranges(rep.layers)} ({len(rep.layers)}{of} layers)")
    if rep.num_params is not None:
        add("parameters", f"{rep.num_params:,}")
        add("size", f"{_size(rep.bytes)} as stored ({rep.dtype}); {_size(rep.bytes_bf16)} in bf16")
    for e in rep.extras:  # served features beyond plain LoRA pairs, with their cost
        slot = f"; +{_size(e.slot_bytes)} per GPU slot" if e.slot_bytes is not None else ""
        add(e.kind, f"{e.params:,} parameters ({_size(e.bytes_bf16)} in bf16){slot}. {e.note}")
    console.print(summary)

    if rep.modules:
        table = Table(title="LoRA modules", title_justify="left")
        for col in ("module", "layers", "rank", "alpha", "scaling", "in", "out", "params"):
            table.add_column(col, justify="left" if col in ("module", "layers") else "right")
        for row in rep.modules:
            table.add_row(
                row.module,
                layer_ranges(row.layers),
                str(row.rank),
                _num(row.alpha),
                f"{row.scaling:.4g}",
                str(row.in_features),
                str(row.out_features),
                f"{row.params:,}",
            )
        console.print(table)

    if rep.servable:
        console.print("[bold green]servable by multilora: yes[/]")
    else:
        console.print(
            f"[bold red]servable by multilora: no[/], because {escape(rep.reason or '')}",
            highlight=False,
            soft_wrap=True,
        )  # one line: easy to grep, whatever its length


def layer_ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    out, start, prev = [], None, None
    for i in sorted(layers):
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ", ".join(out)
