"""constraint.parse_constraint: the request fields' shapes -> one Constraint (or None), keyed so that the same
schema written in another key order compiles once; a malformed field or two constraints on a line are a
ConfigError (that line's `invalid_sampling` record)."""

from __future__ import annotations

import pytest

from multilora_cli.constraint import Constraint, parse_constraint
from multilora_cli.errors import ConfigError


def js(schema, **kw):
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, **kw}}}


def test_shapes():
    assert parse_constraint({}) is None and parse_constraint({"response_format": None}) is None
    assert parse_constraint({"response_format": {"type": "text"}}) is None
    assert parse_constraint({"response_format": {"type": "json_object"}}) == Constraint("json_object")
    assert parse_constraint({"regex": "a+"}) == Constraint("regex", "a+")
    assert parse_constraint({"choice": ["b", "a", "b"]}) == Constraint("choice", '["b","a"]')
    a = parse_constraint(js({"type": "object", "properties": {"x": {"type": "integer"}}}, strict=True))
    b = parse_constraint(js({"properties": {"x": {"type": "integer"}}, "type": "object"}))
    assert a == b and a.kind == "json_schema" and hash(a) == hash(b)  # one cache entry; strict changes nothing
    assert parse_constraint({"response_format": {"type": "text"}, "regex": "a"}) == Constraint("regex", "a")


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"response_format": "json"}, "must be an object"),
        ({"response_format": {"type": "json"}}, "is not served"),
        ({"response_format": {"type": "json_schema"}}, "json_schema must be an object"),
        (js([1]), "schema must be a JSON Schema object"),
        (js({}, strict="yes"), "strict must be true or false"),
        ({"regex": ""}, "regex must be a non-empty string"),
        ({"choice": []}, "choice must be a non-empty array"),
        ({"choice": ["a", ""]}, "choice must be a non-empty array"),
        ({"regex": "a", "choice": ["a"]}, "regex and choice were both given"),
    ],
)
def test_malformed_fields_are_config_errors(fields, words):
    with pytest.raises(ConfigError, match=words):
        parse_constraint(fields)


@pytest.mark.parametrize(
    "extra", [{"logprobs": True}, {"logprobs": 1}, {"prompt_logprobs": 0}, {"n": True}, {"n": 2}, {"regex": "a+"}]
)
def test_a_scoring_line_refuses_what_would_shape_a_generation(extra):
    """True == 1 and 0 == False in Python: a scoring line must not take them for the no-op values."""
    from multilora_cli.io.simple import SimpleFormat

    spec = SimpleFormat().parse({"id": "s", "prompt": "ctx", "continuation": " x", **extra}, 0, 1)
    assert spec.error is not None, extra
