"""A record -> its JSONL line, with parts of it already JSON text (`RawJson`: a line's logprobs, built by
io/logprob_json.py without dicts).

json.dumps cannot write text as it is, so each RawJson goes through json's `default` hook as a marker string
and its text replaces the marker's encoding afterwards. The marker holds control characters, which json always
escapes, so a user's string can only produce it by holding the same characters; then the marker count is off and
the line is encoded the slow way (each RawJson's `plain()` value), as it is when the line needs ASCII escapes (a
lone surrogate). Either way the bytes are those of json.dumps on the plain record.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_MARK = "\x00\x01multilora-raw-json\x01\x00"
_MARK_JSON = json.dumps(_MARK)  # "\u0000\u0001multilora-raw-json\u0001\u0000" (with its quotes)


class RawJson:
    """JSON text standing in a record for the value `plain()` returns (the same JSON, as dicts and lists)."""

    __slots__ = ("text", "plain")

    def __init__(self, text: str, plain: Callable[[], Any]):
        self.text = text  # what json.dumps(plain(), ensure_ascii=False) writes
        self.plain = plain

    def __repr__(self) -> str:
        return f"RawJson({self.text!r})"


def _plain(o: Any) -> Any:
    if isinstance(o, RawJson):
        return o.plain()
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def plain_record(record: Any) -> Any:
    """`record` with every RawJson replaced by its plain value (what a record read back from the line is)."""
    return json.loads(json.dumps(record, ensure_ascii=False, default=_plain))


def _dumps_raw(record: dict) -> str | None:
    """The line's text (newline included) with RawJson texts spliced in; None if a marker collided with the
    record's own text."""
    raws: list[str] = []

    def mark(o: Any) -> str:
        if isinstance(o, RawJson):
            raws.append(o.text)
            return _MARK
        raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

    text = json.dumps(record, ensure_ascii=False, default=mark)
    if not raws:
        return text + "\n"
    parts = text.split(_MARK_JSON)
    if len(parts) != len(raws) + 1:
        return None
    out = [parts[0]]
    for raw, part in zip(raws, parts[1:]):
        out += (raw, part)
    out.append("\n")
    return "".join(out)


def encode_record(record: dict) -> bytes:
    """One JSONL line. Lone surrogates (from \\ud800 escapes in the input) fall back to ASCII escapes."""
    try:
        line = _dumps_raw(record)
        if line is None:
            line = json.dumps(record, ensure_ascii=False, default=_plain) + "\n"
        return line.encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(record, ensure_ascii=True, default=_plain) + "\n").encode("ascii")
