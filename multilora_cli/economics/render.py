"""Rich tables for humans: assumptions with their sources, the adapter's modules, then every section."""

from __future__ import annotations

import os

from multilora_cli.economics.report import Report
from multilora_cli.economics.scenario import Assumption
from multilora_cli.economics.units import n, size

PIPE_WIDTH = 160  # columns when stdout is not a terminal and COLUMNS is unset


def assumption_value(a: Assumption) -> str:
    """An assumption's value with its unit, as the Assumptions table prints it (plots' captions reuse it)."""
    return f"{n(a.value) if isinstance(a.value, (int, float)) else a.value}{' ' + a.unit if a.unit else ''}"


def render(report: Report, console=None, err_console=None, curves=()) -> None:
    """Print `report` as tables; each figure sits beside how it follows from the assumptions.

    `curves`: lines (str or rich Text) printed under the tables, before the one-line summary that ends stdout.
    Warnings go to `err_console` (default stderr), one line each: stdout holds the results only.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal and not os.environ.get("COLUMNS"):  # piped: rich would wrap at 80 columns
            console = Console(width=PIPE_WIDTH)

    def row(table, *cells: str) -> None:
        # cells hold paths and model names ("a[bold]x", "q[/b]"): rich would read them as markup
        table.add_row(*(escape(str(c)) for c in cells))

    t = Table(title="Assumptions", title_justify="left", show_lines=False)
    for col in ("assumption", "value", "source", "note"):
        t.add_column(col, overflow="fold")
    for a in report.assumptions:
        row(t, a.label, assumption_value(a), a.source, a.note)
    console.print(t)

    t = Table(title="Adapter modules: params = layers × r × (in + out)", title_justify="left")
    for col in ("module", "in → out", "rank", "layers", "params/layer", "params", "bytes"):
        t.add_column(col, justify="left" if col in ("module", "in → out") else "right")
    for m in report.modules:
        row(
            t,
            m["module"],
            f"{m['in_features']} → {m['out_features']}",
            str(m["rank"]),
            str(m["layers"]),
            n(m["params_per_layer"]),
            n(m["params"]),
            size(m["bytes"]),
        )
    console.print(t)

    for s in report.sections:
        t = Table(title=escape(s.title), title_justify="left")
        t.add_column("figure")
        t.add_column("value", justify="right")
        t.add_column("how", overflow="fold", style="dim")
        for f in s.figures:
            row(t, f.label, f.shown, f.how)
        console.print(t)
    for line in curves:  # one line each, whatever the width: a wrapped sparkline would lose its shape
        console.print(line, highlight=False, soft_wrap=True)

    if err_console is None:
        err_console = Console(stderr=True)
    for w in report.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)  # paths may hold [..]
    # one line, whatever its length
    console.print(f"[bold]{escape(report.summary)}[/]", highlight=False, soft_wrap=True)
