"""`multilora run` with structured output: `response_format` (json_object, json_schema), `regex` and `choice` on
simple lines, `response_format` in OpenAI completions and chat bodies; each finished output satisfies its
constraint, and a bad one is that line's error record only. The tiny random model of tests/run/helpers.py."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.run.helpers import read_jsonl, run_cli, write_jsonl

PROMPT = "The court held that the"
SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["guilty", "not guilty"]},
        "years": {"type": "integer", "minimum": 0, "maximum": 30},
    },
    "required": ["verdict", "years"],
    "additionalProperties": False,
}
RF = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}


def args(model_dir, inp):
    return ["run", str(inp), "-m", str(model_dir / "base"), "-a", f"legal={model_dir / 'legal'}", "--device", "cpu"]


def test_simple_lines_with_constraints(model_dir, tmp_path):
    lines = [
        {"id": "schema", "adapter": "legal", "prompt": PROMPT, "response_format": RF, "max_tokens": 40},
        {"id": "object", "prompt": PROMPT, "response_format": {"type": "json_object"}, "max_tokens": 40},
        {"id": "regex", "adapter": "legal", "prompt": PROMPT, "regex": "[0-9]{2}-[a-f]{3}", "temperature": 1.0},
        {"id": "choice", "prompt": PROMPT, "choice": ["affirmed", "reversed"], "n": 3, "temperature": 1.0},
        {"id": "text", "prompt": PROMPT, "response_format": {"type": "text"}, "max_tokens": 3, "ignore_eos": True},
        {"id": "bad_regex", "prompt": PROMPT, "regex": "(unclosed"},
        {
            "id": "bad_schema",
            "prompt": PROMPT,
            "response_format": {"type": "json_schema", "json_schema": {"schema": []}},
        },
        {"id": "two", "prompt": PROMPT, "regex": "a", "choice": ["a"]},
        {"id": "free", "adapter": "legal", "prompt": PROMPT, "max_tokens": 5, "ignore_eos": True},
    ]
    rc, out, err = run_cli([*args(model_dir, write_jsonl(tmp_path / "in.jsonl", lines)), "-q"])
    assert rc == 3, err  # some lines failed
    by = {r["id"]: r for r in read_jsonl(out)}
    assert list(by) == [x["id"] for x in lines]
    jsonschema.validate(json.loads(by["schema"]["text"]), SCHEMA)
    assert by["schema"]["finish_reason"] == "stop"
    obj = by["object"]  # a random model may wander inside a key until max_tokens: then only the start is sure
    if obj["finish_reason"] == "stop":
        assert isinstance(json.loads(obj["text"]), dict)
    else:
        assert obj["text"].startswith("{") and obj["usage"]["completion_tokens"] == 40
    assert re.fullmatch("[0-9]{2}-[a-f]{3}", by["regex"]["text"]) and by["regex"]["finish_reason"] == "stop"
    assert [c["text"] in ("affirmed", "reversed") for c in by["choice"]["choices"]] == [True] * 3
    assert by["text"]["usage"]["completion_tokens"] == 3
    assert by["bad_regex"]["error"]["code"] == "invalid_constraint"
    assert by["bad_schema"]["error"]["code"] == "invalid_sampling"
    assert "json_schema.schema must be a JSON Schema object" in by["bad_schema"]["error"]["message"]
    assert by["two"]["error"]["code"] == "invalid_sampling" and "give one of" in by["two"]["error"]["message"]
    assert by["free"]["usage"]["completion_tokens"] == 5 and "error" not in by["free"]


@pytest.mark.parametrize("url", ["/v1/completions", "/v1/chat/completions"])
def test_openai_bodies_with_response_format(model_dir, tmp_path, url):
    ask = {"messages": [{"role": "user", "content": PROMPT}]} if "chat" in url else {"prompt": PROMPT}
    bodies = {
        "schema": {"response_format": RF, "max_tokens": 40},
        "object": {"response_format": {"type": "json_object"}, "max_tokens": 40, "temperature": 0.8, "seed": 2},
        "regex": {"regex": "a+"},  # not an OpenAI field: refused in a body
    }
    rows = [
        {"custom_id": k, "method": "POST", "url": url, "body": {"model": "legal", **ask, **b}}
        for k, b in bodies.items()
    ]
    rc, out, err = run_cli([*args(model_dir, write_jsonl(tmp_path / "b.jsonl", rows)), "-q"])
    assert rc == 3, err
    by = {r["custom_id"]: r for r in read_jsonl(out)}

    def text(r):
        choice = r["response"]["body"]["choices"][0]
        return choice["message"]["content"] if "chat" in url else choice["text"]

    jsonschema.validate(json.loads(text(by["schema"])), SCHEMA)
    assert text(by["object"]).startswith("{")
    assert by["regex"]["error"]["code"] == "unsupported_field"


def test_resume_completes_constrained_lines_to_the_uninterrupted_output(model_dir, tmp_path):
    lines = [
        {"id": "a", "adapter": "legal", "prompt": PROMPT, "response_format": RF, "max_tokens": 40},
        {"id": "b", "prompt": PROMPT, "regex": "[0-9]{2}-[a-f]{3}", "temperature": 1.0},
        {"id": "c", "prompt": PROMPT, "choice": ["affirmed", "reversed"]},
    ]
    inp = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    base = [*args(model_dir, inp)[1:], "-q", "-o", str(out)]
    assert run_cli(["run", *base])[0] == 0
    whole = out.read_bytes()
    kept = whole.splitlines(keepends=True)
    out.write_bytes(kept[0] + kept[1][:9])  # a kill mid-record
    rc, _, err = run_cli(["run", *base, "--resume"])
    assert rc == 0, err
    assert out.read_bytes() == whole
