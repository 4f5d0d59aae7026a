"""`Constraint`: what a request's output must match (structured output), read from its request fields.

Fields (one per request; the formats say which they take):
- `response_format` (OpenAI's object): {"type": "text"} (no constraint), {"type": "json_object"} (any JSON
  object), {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}} (JSON valid
  against `schema`; enforced whether `strict` is true or not: decoding cannot produce text outside the grammar).
- `regex`: the whole output matches the regular expression (Rust `regex` syntax, as llguidance reads it).
- `choice`: the output is exactly one of the given non-empty strings.

Only the shape is checked here (a ConfigError, that line's error record); whether a schema or regex compiles is
the grammar compiler's check (engine/grammar/compiler.py), also per line. A Constraint is frozen and hashable:
its (kind, source) is the key compiled grammars are cached under.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from multilora_cli.errors import ConfigError

FIELDS = ("response_format", "regex", "choice")
KINDS = ("json_object", "json_schema", "regex", "choice")


@dataclass(frozen=True, slots=True)
class Constraint:
    """kind: one of KINDS; source: the schema as canonical JSON (json_schema), the regex, the choices as a JSON
    array (choice), "" (json_object)."""

    kind: str
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"constraint kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @property
    def label(self) -> str:
        """A short name for messages: 'json_schema', 'regex', ..."""
        return self.kind


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _response_format(rf: Any) -> Constraint | None:
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise ConfigError('response_format must be an object with a "type": "text", "json_object" or "json_schema"')
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object")
    if kind != "json_schema":
        raise ConfigError(f'response_format.type {kind!r} is not served: give "text", "json_object" or "json_schema"')
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise ConfigError('response_format.json_schema must be an object {"name", "schema", "strict"}')
    schema = js.get("schema", {})  # OpenAI: an omitted schema is "any JSON"; {} says the same
    if not isinstance(schema, (dict, bool)):
        raise ConfigError("response_format.json_schema.schema must be a JSON Schema object")
    strict = js.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ConfigError(f"response_format.json_schema.strict must be true or false, got {strict!r}")
    name = js.get("name")
    if name is not None and not isinstance(name, str):
        raise ConfigError("response_format.json_schema.name must be a string")
    return Constraint("json_schema", _canonical(schema))


def parse_constraint(fields: dict) -> Constraint | None:
    """The Constraint a request's fields ask for (`fields`: any of FIELDS, None values count as absent), or None.
    More than one of them fails the line: each alone says what the whole output is."""
    given = {k: v for k, v in fields.items() if k in FIELDS and v is not None}
    out = [_response_format(given["response_format"])] if "response_format" in given else []
    if "regex" in given:
        rx = given["regex"]
        if not isinstance(rx, str) or not rx:
            raise ConfigError(f"regex must be a non-empty string, got {rx!r}")
        out.append(Constraint("regex", rx))
    if "choice" in given:
        ch = given["choice"]
        if not isinstance(ch, list) or not ch or not all(isinstance(c, str) and c for c in ch):
            raise ConfigError(f"choice must be a non-empty array of non-empty strings, got {ch!r}")
        out.append(Constraint("choice", _canonical(list(dict.fromkeys(ch)))))
    out = [c for c in out if c is not None]
    if len(out) > 1:
        raise ConfigError(f"give one of {', '.join(FIELDS)}: {' and '.join(c.kind for c in out)} were both given")
    return out[0] if out else None
