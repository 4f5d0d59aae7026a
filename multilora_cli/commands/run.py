"""`multilora run` (placeholder until its issue lands)."""

from __future__ import annotations

from multilora_cli.errors import MultiloraError


def command() -> int:
    """Not implemented yet."""
    raise MultiloraError("'multilora run' is not implemented yet")
