"""`multilora inspect PATH_OR_ID [--model M] [--json]`: what an adapter is and whether multilora can serve it."""

from __future__ import annotations

import typer


def command(
    adapter: str = typer.Argument(
        ..., metavar="PATH_OR_ID", help="Adapter folder or Hugging Face Hub id (id@revision)."
    ),
    model: str | None = typer.Option(
        None, "--model", "-m", metavar="MODEL", help="Base model (path or Hub id) to check shapes against."
    ),
    as_json: bool = typer.Option(False, "--json", metavar="", help="Print one JSON object instead of tables."),
) -> int:
    """Show an adapter's base model, ranks, alphas, scaling, targets, size and whether it is servable.

    Exit 0 when servable, 1 when not (the reason also goes to stderr as one line).
    """
    import json

    from multilora_cli.adapters.render import render
    from multilora_cli.adapters.report import build_report

    report = build_report(adapter, model)
    if as_json:
        typer.echo(json.dumps(report.to_json()))
    else:
        render(report)
    if report.error is not None:
        raise report.error
    return 0
