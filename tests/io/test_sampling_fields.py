"""The logits-processing fields on lines (simple and OpenAI bodies, both URLs), CLI flags and generation_config.json:
parsed, validated (a bad line value -> that line's invalid_sampling record, a bad flag -> exit 2) and layered with
the same precedence as the other sampling fields (line > flags > generation_config.json > defaults)."""

from __future__ import annotations

import json

import pytest

from multilora_cli.config import SamplingParams
from multilora_cli.engine.generation_config import read_generation_config
from multilora_cli.errors import UsageError
from multilora_cli.io.formats import get_format, parse_line
from multilora_cli.io.line import OPENAI, SIMPLE, LineSpec
from multilora_cli.io.sampling import SamplingFlags, SamplingResolver

FIELDS = {
    "min_p": 0.1,
    "repetition_penalty": 1.2,
    "frequency_penalty": 0.5,
    "presence_penalty": -0.5,
    "logit_bias": {"5": 100, "7": -1.5},
    "min_tokens": 3,
    "stop_token_ids": [7, 9],
    "ignore_eos": True,
}


def parse(obj, fmt=SIMPLE):
    return parse_line(json.dumps(obj).encode(), 0, 3, get_format(fmt))


def resolve(**sampling) -> SamplingParams | LineSpec:
    spec = LineSpec(0, 3, 3, sampling=sampling)
    got = SamplingResolver().resolve(spec)
    return got if got is not None else spec


@pytest.mark.parametrize("url", ["/v1/completions", "/v1/chat/completions"])
def test_fields_are_read_from_simple_lines_and_openai_bodies(url):
    s = parse({"prompt": "hi", **FIELDS})
    assert s.error is None and s.sampling == FIELDS
    body = {
        "model": "legal",
        **({"prompt": "hi"} if url == "/v1/completions" else {"messages": [{"role": "user", "content": "q"}]}),
    }
    o = parse({"custom_id": "c", "method": "POST", "url": url, "body": {**body, **FIELDS, "max_tokens": 9}}, OPENAI)
    assert o.error is None and o.sampling == {**FIELDS, "max_tokens": 9}
    p = SamplingResolver().resolve(o)
    assert p.logit_bias == {5: 100.0, 7: -1.5} and p.stop_token_ids == [7, 9] and p.ignore_eos is True
    assert (p.min_p, p.repetition_penalty, p.frequency_penalty, p.presence_penalty, p.min_tokens) == (
        0.1,
        1.2,
        0.5,
        -0.5,
        3,
    )


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("min_p", 1.5, "min_p must be a number in [0, 1]"),
        ("min_p", "0.1", "min_p must be a number in [0, 1]"),
        ("repetition_penalty", 0, "repetition_penalty must be a finite number > 0"),
        ("repetition_penalty", float("inf"), "repetition_penalty must be a finite number > 0"),
        ("frequency_penalty", 2.5, "frequency_penalty must be a number in [-2, 2]"),
        ("presence_penalty", -3, "presence_penalty must be a number in [-2, 2]"),
        ("presence_penalty", True, "presence_penalty must be a number in [-2, 2]"),
        ("logit_bias", {"5": 101}, "logit_bias values must be numbers in [-100, 100], got 101 for token '5'"),
        ("logit_bias", {"x": 1}, "logit_bias keys must be token ids (integers >= 0), got 'x'"),
        ("logit_bias", {"-1": 1}, "logit_bias keys must be token ids"),
        ("logit_bias", {"5": True}, "logit_bias values must be numbers"),
        ("logit_bias", [5], "logit_bias must be an object mapping token ids to biases"),
        ("min_tokens", -1, "min_tokens must be an integer >= 0"),
        ("min_tokens", 300, "min_tokens must be <= max_tokens, got 300 > 256"),
        ("stop_token_ids", 7, "stop_token_ids must be a list of token ids"),
        ("stop_token_ids", [7, "8"], "stop_token_ids must be a list of token ids"),
        ("ignore_eos", 1, "ignore_eos must be true or false"),
    ],
)
def test_bad_values_fail_their_line(field, value, words):
    s = resolve(**{field: value})
    assert isinstance(s, LineSpec) and s.error.code == "invalid_sampling", s
    assert s.error.message.startswith("line 3: ") and words in s.error.message, s.error.message


def test_no_op_values_resolve_to_the_defaults():
    neutral = dict(min_p=0, repetition_penalty=1, frequency_penalty=0, presence_penalty=0, logit_bias={})
    p = resolve(**neutral, min_tokens=0, stop_token_ids=[], ignore_eos=False)
    assert p == SamplingParams() and not p.processes_logits


def test_precedence_line_over_flags_over_generation_config():
    model = {"repetition_penalty": 1.05, "min_p": 0.05, "min_tokens": 2}
    flags = SamplingFlags(repetition_penalty=1.3, frequency_penalty=0.5, min_tokens=4)
    r = SamplingResolver(model, flags)
    p = r.resolve(LineSpec(0, 1, 1, sampling={"frequency_penalty": -1.0}))
    assert (p.repetition_penalty, p.min_p, p.min_tokens, p.frequency_penalty) == (1.3, 0.05, 4, -1.0)
    assert SamplingResolver(model).defaults.repetition_penalty == 1.05


@pytest.mark.parametrize(
    "flags, words",
    [
        (dict(min_p=2.0), "--min-p must be a number in [0, 1]"),
        (dict(repetition_penalty=0.0), "--repetition-penalty must be a finite number > 0"),
        (dict(frequency_penalty=float("nan")), "--frequency-penalty must be a number in [-2, 2]"),
        (dict(presence_penalty=5.0), "--presence-penalty must be a number in [-2, 2]"),
        (dict(min_tokens=9, max_tokens=8), "--min-tokens must be <= max_tokens, got 9 > 8"),
    ],
)
def test_bad_flags_are_usage_errors(flags, words):
    with pytest.raises(UsageError) as e:
        SamplingFlags(**flags)
    assert e.value.exit_code == 2 and e.value.message.startswith(words), e.value.message


def test_min_tokens_flag_is_checked_against_max_tokens_where_it_is_known():
    assert SamplingFlags(min_tokens=300).given() == {"min_tokens": 300}  # generation_config may allow it
    spec = LineSpec(0, 1, 1)
    assert SamplingResolver({}, SamplingFlags(min_tokens=300)).resolve(spec) is None
    assert "min_tokens must be <= max_tokens, got 300 > 256" in spec.error.message
    assert (
        SamplingResolver({"max_tokens": 400}, SamplingFlags(min_tokens=300)).resolve(LineSpec(0, 1, 1)).min_tokens
        == 300
    )


@pytest.mark.parametrize(
    "gc, want",
    [
        ({"repetition_penalty": 1.05}, {"repetition_penalty": 1.05}),  # applies to greedy decoding too
        (
            {"repetition_penalty": 1.1, "min_new_tokens": 3, "max_new_tokens": 9},
            {"repetition_penalty": 1.1, "min_tokens": 3, "max_tokens": 9},
        ),
        ({"min_p": 0.1}, {}),  # sampling-only: greedy without do_sample
        ({"do_sample": True, "min_p": 0.1}, {"temperature": 1.0, "min_p": 0.1}),
        (
            {"do_sample": False, "min_p": 0.1, "repetition_penalty": 1.2},
            {"temperature": 0.0, "repetition_penalty": 1.2},
        ),
        ({"repetition_penalty": 0}, {}),  # not a valid penalty: not applied (as other invalid defaults)
    ],
)
def test_generation_config_defaults(tmp_path, gc, want):
    (tmp_path / "generation_config.json").write_text(json.dumps(gc))
    gen = read_generation_config(tmp_path)
    assert gen.sampling == want and gen.not_applied == []
