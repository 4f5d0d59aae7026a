"""Input line formats: the `Format` protocol, which format a file uses, and parsing a raw line.

Two formats, detected per file from its first JSON object line:
- simple: `{"id", "prompt" | "messages", "adapter" (alias "model"), max_tokens, temperature, top_p, top_k, seed, stop,
  n}`
- OpenAI batch: `{"custom_id", "method", "url", "body": {...}}` (a `custom_id`, and a `body` or no top-level prompt)

Parsing never raises for a bad line: the problem lands in `LineSpec.error` and becomes that line's error record,
so one bad line never costs another line its output.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from multilora_cli.io.line import OPENAI, SIMPLE, Choice, LineLogprobs, LineSpec, json_type
from multilora_cli.io.openai_batch import OpenAIBatchFormat
from multilora_cli.io.simple import SimpleFormat


class Format(Protocol):
    """What the run needs from a format: parse a line object, build records, read ids back for --resume."""

    name: str

    def parse(self, obj: dict, key: int, lineno: int) -> LineSpec: ...

    def default_id(self, lineno: int) -> Any: ...

    def ok_record(
        self,
        spec: LineSpec,
        text: str,
        finish_reason: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        choices: list[Choice] | None = None,
        logprobs: LineLogprobs | None = None,
    ) -> dict:
        """The record of a line that ran. `choices`: a line with n > 1, every sample's (text, finish_reason) in
        index order (`text` / `finish_reason` are then ignored, `completion_tokens` is the sum). `logprobs`: what
        the line asked for of logprobs, prompt logprobs and echo (None: nothing)."""
        ...

    def score_record(self, spec: LineSpec, logprob: float, is_greedy: bool, token_logprobs: list[float]) -> dict:
        """The record of a scoring line (simple format: OpenAI lines score through echo + max_tokens 0)."""
        ...

    def error_record(self, spec: LineSpec, code: str, message: str) -> dict: ...

    def record_id(self, record: dict) -> Any: ...

    def is_error_record(self, record: dict) -> bool: ...

    def looks_like_record(self, record: dict) -> bool: ...


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode_line(raw: bytes, key: int, lineno: int, fmt: Format) -> tuple[dict | None, LineSpec | None]:
    """bytes -> JSON object, or a failed LineSpec (invalid UTF-8, malformed JSON, NaN, not an object)."""
    try:
        text = raw.decode("utf-8").rstrip()  # no trailing newline: error columns stay on this line
    except UnicodeDecodeError as e:
        spec = LineSpec(key, lineno, fmt.default_id(lineno))
        return None, spec.fail(f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})", "invalid_utf8")
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except ValueError as e:
        msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        col = ""
        if isinstance(e, json.JSONDecodeError):  # some messages end in "at" ("Unterminated string starting at")
            col = f" column {e.colno}" if msg.endswith(" at") else f" at column {e.colno}"
        if msg == "Extra data" and "\r" in text:  # the reader splits on \n only: a CR-only file is one "line"
            col += " (carriage returns inside the line: CR-only line endings? convert them with tr '\\r' '\\n')"
        spec = LineSpec(key, lineno, fmt.default_id(lineno))
        return None, spec.fail(f"malformed JSON: {msg}{col}", "invalid_json")
    if not isinstance(obj, dict):
        spec = LineSpec(key, lineno, fmt.default_id(lineno))
        return None, spec.fail(f"expected a JSON object, got {json_type(obj)}", "invalid_json")
    return obj, None


def parse_line(raw: bytes, key: int, lineno: int, fmt: Format) -> LineSpec:
    """Parse one raw non-blank line in `fmt`. Never raises for bad input."""
    obj, failed = decode_line(raw, key, lineno, fmt)
    if failed is not None:
        return failed
    spec = fmt.parse(obj, key, lineno)
    if spec.error is None:
        check_text(spec)
    return spec


def _lone_surrogate(text: str) -> str | None:
    """The first unpaired UTF-16 surrogate in `text` (JSON lets `"\\ud800"` through; tokenizers reject it)."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return text[e.start]


def check_text(spec: LineSpec) -> None:
    """Fail the line if text bound for the tokenizer (prompt, messages, stop) is not valid Unicode."""
    stop = spec.sampling.get("stop")
    fields = [("prompt", spec.prompt)]
    for i, m in enumerate(spec.messages or []):
        fields += [(f"messages[{i}].role", m.get("role")), (f"messages[{i}].content", m.get("content"))]
    fields += [("stop", s) for s in ([stop] if isinstance(stop, str) else stop if isinstance(stop, list) else [])]
    for name, text in fields:
        bad = _lone_surrogate(text) if isinstance(text, str) else None
        if bad is not None:
            spec.fail(
                f"{name} holds a lone UTF-16 surrogate (\\u{ord(bad):04x}), which is not text; "
                "escape characters outside the BMP as a surrogate pair or write them as UTF-8"
            )
            return


def detect_format(obj: dict) -> str:
    """The format of a file whose first JSON object line is `obj`. A `custom_id` beside a top-level prompt or
    messages and no `body` is a simple line's metadata (other fields are ignored there), not a batch line."""
    if "custom_id" not in obj:
        return SIMPLE
    return OPENAI if "body" in obj or not ("prompt" in obj or "messages" in obj) else SIMPLE


def get_format(name: str) -> Format:
    return OpenAIBatchFormat() if name == OPENAI else SimpleFormat()
