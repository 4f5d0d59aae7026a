"""Path helpers every layer uses (io, adapters, run): below all of them, so none imports another for a path."""

from __future__ import annotations

from pathlib import Path


def expand_user(spec: str | Path) -> Path:
    """`spec` with a leading `~` / `~user` expanded; as typed when that user does not exist (Path.expanduser
    raises RuntimeError there), so the caller says the path does not exist instead of crashing."""
    try:
        return Path(spec).expanduser()
    except RuntimeError:
        return Path(spec)
