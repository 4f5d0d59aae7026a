"""JSON value comparisons shared by request parsing (io/unserved.py) and generation_config.json reading
(models/generation_unapplied.py): whether a given value is a field's no-op."""

from __future__ import annotations

from typing import Any


def same_json(value: Any, neutral: Any) -> bool:
    """JSON equality: true is not 1, 1 is 1.0."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    if isinstance(value, (int, float)) and isinstance(neutral, (int, float)):
        return value == neutral
    return type(value) is type(neutral) and value == neutral


def is_no_op(value: Any, neutral: tuple) -> bool:
    return value is None or any(same_json(value, n) for n in neutral)
