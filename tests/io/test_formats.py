"""Line parsing for the simple and OpenAI batch formats: every bad line becomes one clear error, never a crash."""

from __future__ import annotations

import json

import pytest

from multilora_cli.io.formats import get_format, parse_line
from multilora_cli.io.line import OPENAI, SIMPLE

S = get_format(SIMPLE)
O = get_format(OPENAI)


def parse(obj_or_raw, fmt=S, key=0, lineno=1):
    raw = obj_or_raw if isinstance(obj_or_raw, bytes) else json.dumps(obj_or_raw).encode()
    return parse_line(raw, key, lineno, fmt)


def test_simple_line_fields_and_default_id():
    s = parse(
        {"prompt": "hi", "adapter": "legal", "max_tokens": 5, "temperature": 0.5, "stop": ["\n"], "extra": 1}, lineno=7
    )
    assert s.error is None and s.id == 7 and s.adapter == "legal" and s.prompt == "hi"
    assert s.sampling == {"max_tokens": 5, "temperature": 0.5, "stop": ["\n"]}
    assert parse({"id": "a1", "prompt": "x"}).id == "a1"
    assert parse({"id": 42, "prompt": "x"}).id == 42  # the JSON type the user gave is kept


def test_simple_metadata_fields_are_ignored():
    s = parse({"prompt": "x", "meta": {"a": 1}, "category": "tax", "lang": "en", "seed": 3})
    assert s.error is None and s.sampling == {"seed": 3}


def test_roles_a_template_may_define_pass_through():
    for role in ("model", "ipython", "function", "tool", "developer", "human"):
        s = parse({"messages": [{"role": role, "content": "x"}]})
        assert s.error is None, (role, s.error)


def test_simple_messages_with_text_parts():
    s = parse(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    )
    assert s.error is None and s.messages == [{"role": "user", "content": "ab"}]


@pytest.mark.parametrize(
    "obj, code, words",
    [
        ({"id": 1}, "missing_prompt", "missing 'prompt'"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "invalid_request", "not both"),
        ({"prompt": 5}, "invalid_request", "prompt must be a string"),
        ({"messages": []}, "invalid_request", "non-empty array of {role, content} objects, got an empty array"),
        ({"messages": [{"content": "x"}]}, "invalid_request", "messages[0]"),
        ({"messages": [{"role": " ", "content": "x"}]}, "invalid_request", "non-empty string 'role'"),
        (
            {"messages": [{"role": "system", "content": "s"}, {"role": "usr", "content": "x"}]},
            "unknown_role",
            "messages[1].role 'usr' is not a chat role: did you mean 'user'?",
        ),
        ({"messages": [{"role": "Assistant", "content": "x"}]}, "unknown_role", "did you mean 'assistant'?"),
        ({"messages": [{"role": "sytem", "content": "x"}]}, "unknown_role", "did you mean 'system'?"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "invalid_request", "text parts"),
        ({"id": [1], "prompt": "x"}, "invalid_request", "id must be a string or an integer"),
        ({"prompt": "x", "adapter": 3}, "invalid_request", "adapter must be a string"),
        ({"custom_id": "c", "body": {}}, "wrong_format", "OpenAI batch line"),
        (
            {"prompt": "x", "temprature": 0.5},
            "unknown_field",
            "unknown field 'temprature': did you mean 'temperature'?",
        ),
        ({"prompt": "x", "top-p": 0.5}, "unknown_field", "did you mean 'top_p'?"),
        ({"prompt": "x", "max_token": 5}, "unknown_field", "did you mean 'max_tokens'?"),
        ({"promt": "x"}, "unknown_field", "did you mean 'prompt'?"),
        ({"prompt": "x", "adapters": "legal"}, "unknown_field", "did you mean 'adapter'?"),
    ],
)
def test_simple_bad_lines(obj, code, words):
    s = parse(obj, lineno=4)
    assert s.error is not None and s.error.code == code
    assert words in s.error.message and s.error.message.startswith("line 4: ")


@pytest.mark.parametrize(
    "raw, code, words",
    [
        (b'{"prompt": "x",}\n', "invalid_json", "malformed JSON"),
        (b'{"prompt": "abc\n', "invalid_json", "Unterminated string starting at column 12"),  # not "at at"
        (b"[1, 2]\n", "invalid_json", "expected a JSON object, got an array"),
        (b'"just a string"\n', "invalid_json", "got a string"),
        (b'{"prompt": "caf\xff"}\n', "invalid_utf8", "not valid UTF-8"),
        (b'{"prompt": "x", "temperature": NaN}\n', "invalid_json", "NaN"),
    ],
)
def test_undecodable_lines_get_the_line_number_as_id(raw, code, words):
    s = parse(raw, lineno=9)
    assert s.error.code == code and words in s.error.message and s.id == 9
    rec = S.error_record(s, s.error.code, s.error.message)
    assert rec == {"id": 9, "adapter": None, "error": {"code": code, "message": s.error.message}}


def test_simple_records():
    s = parse({"id": "a", "prompt": "x", "adapter": "base"})
    ok = S.ok_record(s, "out", "stop", 3, 2)
    assert ok == {
        "id": "a",
        "adapter": "base",
        "text": "out",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    assert S.record_id(ok) == "a" and not S.is_error_record(ok) and S.looks_like_record(ok)


def oai(body=None, url="/v1/completions", **kw):
    line = {"custom_id": "r1", "method": "POST", "url": url, **kw}
    if body is not None:
        line["body"] = body
    return line


def test_openai_completion_and_chat_lines():
    s = parse(oai({"model": "legal", "prompt": "hi", "max_completion_tokens": 4, "temperature": 0.2}), O)
    assert s.error is None and s.id == "r1" and s.adapter == "legal" and s.prompt == "hi"
    assert s.sampling == {"temperature": 0.2, "max_tokens": 4}
    c = parse(oai({"model": "base", "messages": [{"role": "user", "content": "q"}]}, url="/v1/chat/completions"), O)
    assert c.error is None and c.messages[0]["content"] == "q"
    t = parse(oai({"model": "m", "prompt": [1, 2, 3]}), O)
    assert t.prompt_token_ids == [1, 2, 3]


@pytest.mark.parametrize(
    "line, code, words",
    [
        (oai({"model": "m", "prompt": "x"}, url="/v1/embeddings"), "invalid_url", "/v1/embeddings"),
        (oai(None), "missing_body", "body is missing"),
        (oai([1]), "missing_body", "not an object"),
        (oai({"prompt": "x"}), "missing_model", "body.model is required"),
        (oai({"model": "m"}), "missing_prompt", "body.prompt is required"),
        (oai({"model": "m", "messages": [{"role": "user", "content": "q"}]}), "invalid_request", "takes 'prompt'"),
        (oai({"model": "m", "prompt": "x"}, url="/v1/chat/completions"), "invalid_request", "takes 'messages'"),
        (oai({"model": "m", "prompt": ["a", "b"]}), "invalid_request", "one prompt per line"),
        (oai({"model": "m", "prompt": "x", "best_of": 2}), "unsupported_field", "'body.best_of' 2 above body.n (1)"),
        (
            oai({"model": "m", "prompt": "x", "max_tokens": 3, "max_completion_tokens": 4}),
            "invalid_request",
            "not both",
        ),
        (oai({"model": "m", "prompt": "x"}, method="GET"), "invalid_method", "POST"),
        (
            {"custom_id": "", "url": "/v1/completions", "body": {"model": "m", "prompt": "x"}},
            "missing_custom_id",
            "custom_id",
        ),
    ],
)
def test_openai_bad_lines(line, code, words):
    s = parse(line, O, lineno=3)
    assert s.error is not None and s.error.code == code, s.error
    assert words in s.error.message


def test_openai_records_are_deterministic_and_shaped_like_the_batch_api():
    s = parse(oai({"model": "legal", "prompt": "hi"}), O, lineno=5)
    a, b = O.ok_record(s, "yo", "length", 2, 4), O.ok_record(s, "yo", "length", 2, 4)
    assert a["id"] == b["id"] and a["id"].startswith("batch_req_")
    assert a["custom_id"] == "r1" and a["error"] is None
    resp = a["response"]
    assert resp["status_code"] == 200 and resp["request_id"].startswith("req_")
    body = resp["body"]
    assert body["object"] == "text_completion" and body["model"] == "legal"
    assert body["choices"][0]["text"] == "yo" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    other_line = parse(oai({"model": "legal", "prompt": "hi"}), O, lineno=6)
    assert O.ok_record(other_line, "yo", "stop", 1, 1)["id"] != a["id"]

    c = parse(oai({"model": "x", "messages": [{"role": "user", "content": "q"}]}, url="/v1/chat/completions"), O)
    body = O.ok_record(c, "ans", "stop", 1, 1)["response"]["body"]
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "ans"}

    e = O.error_record(s, "unknown_adapter", "nope")
    assert e["response"] is None and e["error"] == {"code": "unknown_adapter", "message": "nope"}
    assert e["id"] == a["id"] and O.is_error_record(e) and O.looks_like_record(e)


@pytest.mark.parametrize(
    "raw, field",
    [
        (rb'{"prompt": "a \ud800 b"}', "prompt"),
        (rb'{"messages": [{"role": "user", "content": "\udfff"}]}', "messages[0].content"),
        (rb'{"messages": [{"role": "\ud800", "content": "x"}]}', "messages[0].role"),
        (rb'{"prompt": "x", "stop": ["\ud801"]}', "stop"),
    ],
)
def test_lone_surrogate_escapes_fail_the_line(raw, field):
    # JSON accepts "\ud800" but it is not text: the tokenizer raised TypeError and the whole run died.
    s = parse(raw)
    assert s.error is not None and s.error.code == "invalid_request", s
    assert s.error.message.startswith(f"line 1: {field} holds a lone UTF-16 surrogate"), s.error.message
    o = parse(
        b'{"custom_id": "c", "method": "POST", "url": "/v1/completions", '
        b'"body": {"model": "base", "prompt": "\\ud800"}}',
        O,
    )
    assert o.error is not None and "lone UTF-16 surrogate" in o.error.message


def test_surrogate_pairs_and_surrogates_outside_the_text_are_fine():
    s = parse(rb'{"id": "\ud800", "prompt": "globe \ud83c\udf0d"}')
    assert s.error is None and s.prompt == "globe \U0001f30d"


def test_empty_adapter_name_is_a_clear_error():
    # It used to be "unknown adapter '' (... add it with --adapters =PATH)", advice that cannot work.
    s = parse({"prompt": "x", "adapter": ""})
    assert s.error is not None and s.error.code == "invalid_request"
    assert "adapter is an empty string" in s.error.message and "'base' / null" in s.error.message
