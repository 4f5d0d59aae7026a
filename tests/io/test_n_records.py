"""`n` in the formats: parsed from simple lines and OpenAI bodies, validated (1..128, an integer: error record
`invalid_sampling`), `best_of` accepted only equal to n, and the records of a line with n > 1 (simple `choices`,
OpenAI's n choices) while n=1 keeps today's record exactly."""

from __future__ import annotations

import json

import pytest

from multilora_cli.io.formats import get_format, parse_line
from multilora_cli.io.line import OPENAI, SIMPLE
from multilora_cli.io.sampling import SamplingResolver

S, O = get_format(SIMPLE), get_format(OPENAI)
CHAT = "/v1/chat/completions"


def parse(obj, fmt=S, lineno=2):
    return parse_line(json.dumps(obj).encode(), 0, lineno, fmt)


def oai(body, url="/v1/completions"):
    return {"custom_id": "c1", "method": "POST", "url": url, "body": {"model": "legal", **body}}


def resolved(spec):
    return SamplingResolver().resolve(spec)


@pytest.mark.parametrize("line, fmt", [({"prompt": "x", "n": 4}, S), (oai({"prompt": "x", "n": 4}), O)])
def test_n_is_read_in_both_formats(line, fmt):
    s = parse(line, fmt)
    assert s.error is None and s.sampling["n"] == 4 and resolved(s).n == 4


@pytest.mark.parametrize("n", [0, 129, -1, 2.0, "2", True, [2]])
def test_bad_n_is_an_invalid_sampling_error(n):
    for line, fmt in (({"prompt": "x", "n": n}, S), (oai({"prompt": "x", "n": n}), O)):
        s = parse(line, fmt)
        assert s.error is None and resolved(s) is None
        assert s.error.code == "invalid_sampling" and "n must be an integer in 1..128" in s.error.message


@pytest.mark.parametrize("n", [None, 1, 128])
def test_n_bounds_and_null(n):
    s = parse({"prompt": "x", "n": n})
    assert resolved(s).n == (n or 1)


@pytest.mark.parametrize(
    "extra, code, words",
    [
        ({"best_of": 3}, "unsupported_field", "field 'best_of' 3 above n (1) is not supported"),
        ({"n": 2, "best_of": 5}, "unsupported_field", "field 'best_of' 5 above n (2)"),
        ({"n": 3, "best_of": 2}, "invalid_sampling", "best_of must be an integer equal to n (3), got 2"),
        ({"n": 2, "best_of": True}, "invalid_sampling", "got true"),
        ({"n": 2, "best_of": 2}, None, ""),
        ({"n": 2, "best_of": 2.0}, None, ""),
        ({"best_of": 1}, None, ""),
        ({"best_of": None}, None, ""),
    ],
)
def test_best_of_is_accepted_only_equal_to_n(extra, code, words):
    s = parse({"prompt": "x", **extra})
    o = parse(oai({"prompt": "x", **extra}), O)
    if code is None:
        assert s.error is None and o.error is None
        return
    assert s.error.code == code and words in s.error.message, s.error.message
    assert o.error.code == code and words.replace("'best_of'", "'body.best_of'").replace(" n (", " body.n (") in (
        o.error.message
    ), o.error.message


def test_num_return_sequences_points_at_n():
    s = parse({"prompt": "x", "num_return_sequences": 3})
    assert s.error.code == "unknown_field" and "did you mean 'n'?" in s.error.message
    assert "not supported" not in s.error.message


def test_simple_record_n1_unchanged_and_n_choices():
    s = parse({"id": "a", "prompt": "x", "adapter": "legal", "n": 2})
    one = S.ok_record(s, "out", "stop", 3, 2)
    assert list(one) == ["id", "adapter", "text", "finish_reason", "usage"]
    rec = S.ok_record(s, "first", "stop", 3, 7, [("first", "stop"), ("second", "length")])
    assert rec == {
        "id": "a",
        "adapter": "legal",
        "choices": [
            {"index": 0, "text": "first", "finish_reason": "stop"},
            {"index": 1, "text": "second", "finish_reason": "length"},
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 7},
    }
    assert S.looks_like_record(rec) and S.record_id(rec) == "a" and not S.is_error_record(rec)


@pytest.mark.parametrize("url", ["/v1/completions", CHAT])
def test_openai_record_has_n_choices_and_summed_usage(url):
    line = oai({"messages": [{"role": "user", "content": "q"}]} if url == CHAT else {"prompt": "x"}, url)
    s = parse({**line, "body": {**line["body"], "n": 3}}, O)
    assert s.error is None
    rec = O.ok_record(s, "a", "stop", 4, 9, [("a", "stop"), ("b", "length"), ("c", "stop")])
    body = rec["response"]["body"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    key = "message" if url == CHAT else "text"
    got = [c[key]["content"] if url == CHAT else c[key] for c in body["choices"]]
    assert got == ["a", "b", "c"] and [c["finish_reason"] for c in body["choices"]] == ["stop", "length", "stop"]
    assert all(c["logprobs"] is None for c in body["choices"])
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13}
    single = O.ok_record(s, "a", "stop", 4, 3)["response"]["body"]
    assert len(single["choices"]) == 1 and single["choices"][0]["index"] == 0
