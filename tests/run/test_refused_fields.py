"""No silent wrong output: a field that would change a line's output but is not served fails that line (one error
record, code `unsupported_field`), other systems' names for served fields get "did you mean" (`unknown_field`),
no-op values and metadata are accepted, and `model` is an alias of `adapter` in simple lines.
"""

from __future__ import annotations

import json

import pytest

from multilora_cli.io.formats import get_format, parse_line
from multilora_cli.io.line import OPENAI, SIMPLE
from multilora_cli.io.simple import FIELDS as SIMPLE_FIELDS
from multilora_cli.io.unserved import NOT_SERVED, RENAMED
from tests.run.helpers import read_jsonl, run_cli

S = get_format(SIMPLE)
O = get_format(OPENAI)
TAIL = "is not supported yet: multilora would ignore it and the output would not be what the line asks for"

# one value per not-served field that asks for something (the table's no-op values are tested apart)
ASKING = {
    "use_beam_search": True,
    "num_beams": 4,
    "length_penalty": 0.5,
    "continuation": " the end",
    "echo": True,
    "suffix": "}",
    "top_logprobs": 5,
    "include_stop_str_in_output": True,
    "skip_special_tokens": False,
    "allowed_token_ids": [1, 2],
    "bad_words": ["x"],
    "bad_words_ids": [[3]],
    "no_repeat_ngram_size": 3,
    "typical_p": 0.9,
    "epsilon_cutoff": 0.001,
    "eta_cutoff": 0.001,
    "truncate_prompt_tokens": 10,
    "regex": "[a-z]+",
    "choice": ["yes", "no"],
    "grammar": "root ::= x",
    "json_schema": {"type": "object"},
    "guided_json": {"type": "object"},
    "guided_regex": "a+",
    "guided_choice": ["a", "b"],
    "guided_grammar": "root ::= x",
    "structured_outputs": {"choice": ["a"]},
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "functions": [{"name": "f"}],
    "tool_choice": "required",
    "function_call": {"name": "f"},
    "chat_template": "{{ messages }}",
    "chat_template_kwargs": {"enable_thinking": False},
    "add_generation_prompt": False,
    "continue_final_message": True,
    "reasoning_effort": "low",
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy"},
    "web_search_options": {},
    "verbosity": "low",
}


def parse(obj, fmt=S, lineno=3):
    return parse_line(json.dumps(obj).encode(), 0, lineno, fmt)


def oai(body, url="/v1/completions"):
    return {"custom_id": "c1", "method": "POST", "url": url, "body": {"model": "legal", "prompt": "hi", **body}}


def test_every_not_served_field_has_an_asking_value():
    assert set(ASKING) == set(NOT_SERVED)


# served by one format only (io/unserved.py): refused by the other
SIMPLE_ONLY = ("continuation",)
OPENAI_ONLY = ("echo", "top_logprobs")


# regex, choice (SIMPLE_FIELDS) and continuation are served on simple lines
@pytest.mark.parametrize("field", sorted(set(ASKING) - set(SIMPLE_ONLY) - set(SIMPLE_FIELDS)))
def test_simple_line_with_a_field_not_served_fails_naming_it(field):
    s = parse({"id": "x", "prompt": "hi", field: ASKING[field]})
    assert s.error is not None and s.error.code == "unsupported_field", (field, s.error)
    assert s.error.message.startswith(f"line 3: field {field!r} {TAIL} (remove it"), s.error.message
    assert "\n" not in s.error.message


@pytest.mark.parametrize("field", sorted(set(ASKING) - set(OPENAI_ONLY)))
def test_openai_body_with_a_field_not_served_fails_naming_it(field):
    s = parse(oai({field: ASKING[field]}), O)
    assert s.error is not None and s.error.code == "unsupported_field", (field, s.error)
    assert s.error.message.startswith(f"line 3: field 'body.{field}' {TAIL}"), s.error.message


@pytest.mark.parametrize("field", sorted(f for f, neutral in NOT_SERVED.items() if neutral))
def test_no_op_values_are_accepted(field):
    for value in (*NOT_SERVED[field], None):
        s = parse({"prompt": "hi", field: value})
        assert s.error is None, (field, value, s.error)
        assert parse(oai({field: value}), O).error is None, (field, value)


@pytest.mark.parametrize(
    "field, value",
    [("typical_p", "1.0"), ("echo", 0)],
)
def test_values_that_only_look_like_no_ops_are_refused(field, value):
    # JSON true is not 1, 0 is not false
    assert parse({"prompt": "hi", field: value}).error.code == "unsupported_field"


def test_neutral_add_special_tokens_depends_on_prompt_or_messages():
    assert parse({"prompt": "hi", "add_special_tokens": True}).error is None
    assert parse({"prompt": "hi", "add_special_tokens": False}).error.code == "unsupported_field"
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert parse({**chat, "add_special_tokens": False}).error is None
    assert parse({**chat, "add_special_tokens": True}).error.code == "unsupported_field"


@pytest.mark.parametrize(
    "field, value, target",
    [
        ("max_new_tokens", 5, "max_tokens"),
        ("max_length", 50, "max_tokens"),
        ("max_completion_tokens", 5, "max_tokens"),
        ("stop_sequences", ["\n"], "stop"),
        ("num_return_sequences", 2, "n"),
        ("min_new_tokens", 2, "min_tokens"),
        ("min_length", 2, "min_tokens"),
    ],
)
def test_other_systems_names_get_did_you_mean(field, value, target):
    s = parse({"prompt": "hi", field: value})
    assert s.error is not None and s.error.code == "unknown_field", s.error
    assert s.error.message.startswith(f"line 3: unknown field {field!r}: did you mean {target!r}? ("), s.error.message
    if field != "max_completion_tokens":  # served in an OpenAI body
        o = parse(oai({field: value}), O)
        assert o.error.code == "unknown_field" and f"did you mean 'body.{target}'?" in o.error.message


def test_renamed_fields_with_no_op_values_are_accepted():
    for field, (_, _, neutral) in RENAMED.items():
        for value in neutral:
            assert parse({"prompt": "hi", field: value}).error is None, (field, value)


@pytest.mark.parametrize(
    "line, ok",
    [
        ({"do_sample": True}, False),  # alone, the CLI / generation_config default would decide: maybe greedy
        ({"do_sample": False}, False),  # ... maybe sampled
        ({"do_sample": True, "temperature": 0}, False),
        ({"do_sample": False, "temperature": 0.7}, False),  # transformers: greedy whatever the temperature says
        ({"do_sample": "yes", "temperature": 0.7}, False),
        ({"do_sample": True, "temperature": 0.7}, True),
        ({"do_sample": False, "temperature": 0}, True),
        ({"do_sample": None}, True),
    ],
)
def test_do_sample_is_accepted_only_beside_a_temperature_that_agrees(line, ok):
    s = parse({"prompt": "hi", **line})
    if ok:
        assert s.error is None, s.error
    else:
        assert s.error.code == "unknown_field" and "did you mean 'temperature'?" in s.error.message
        want = {True: '"temperature" > 0', False: '"temperature": 0'}.get(line["do_sample"], "0 for greedy")
        assert want in s.error.message, s.error.message


def test_near_misses_of_not_served_and_renamed_names():
    assert "did you mean 'logit_bias'?" in parse({"prompt": "x", "logit_bais": {}}).error.message
    assert "did you mean 'frequency_penalty'?" in parse({"prompt": "x", "frequency-penalty": 1}).error.message
    assert "did you mean 'max_tokens'?" in parse({"prompt": "x", "max_new_token": 5}).error.message
    o = parse(oai({"temprature": 0.5}), O)
    assert o.error.code == "unknown_field" and "did you mean 'body.temperature'?" in o.error.message
    o = parse(oai({"max_completion_token": 5}), O)
    assert "did you mean 'body.max_completion_tokens'?" in o.error.message


def test_metadata_stays_allowed():
    meta = {"custom_id": "k", "meta": {"a": 1}, "user": "u", "choices": ["A", "B"], "answer": "A", "lang": "en"}
    s = parse({"prompt": "x", **meta})
    assert s.error is None and s.sampling == {}
    body = {"user": "u", "metadata": {"k": "v"}, "store": False, "stream": False, "stream_options": None}
    body |= {"service_tier": "auto", "seed": 4, "parallel_tool_calls": True, "prediction": {"type": "content"}}
    s = parse(oai(body), O)
    assert s.error is None and s.sampling == {"seed": 4}
    s = parse(oai({"stream": True}), O)
    assert s.error.code == "unsupported_field" and "field 'body.stream' true" in s.error.message


def test_max_completion_tokens_is_served_in_a_body():
    c = {"model": "m", "messages": [{"role": "user", "content": "q"}], "max_completion_tokens": 7}
    s = parse({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": c}, O)
    assert s.error is None and s.sampling == {"max_tokens": 7}


def test_model_is_an_alias_of_adapter():
    s = parse({"prompt": "x", "model": "legal"})
    assert s.error is None and s.adapter == "legal"
    assert parse({"prompt": "x", "model": "legal", "adapter": "legal"}).adapter == "legal"
    assert parse({"prompt": "x", "model": "legal", "adapter": None}).adapter == "legal"
    s = parse({"id": "d", "prompt": "x", "model": "legal", "adapter": "medical"})
    assert s.error.code == "invalid_request"
    assert "adapter 'medical' and model 'legal' differ: 'model' is an alias of 'adapter'" in s.error.message
    assert S.error_record(s, s.error.code, s.error.message)["adapter"] == "medical"
    s = parse({"prompt": "x", "model": 3})
    assert s.error.message == "line 3: model must be a string (an adapter name, or 'base'), got a number"
    assert parse({"prompt": "x", "model": ""}).error.message.startswith("line 3: model is an empty string")
    assert "did you mean 'model'?" in parse({"prompt": "x", "modle": "legal"}).error.message


@pytest.mark.parametrize(
    "field, value",
    [
        ("repetition_penalty", 1.1),
        ("frequency_penalty", 0.5),
        ("presence_penalty", -0.5),
        ("logit_bias", {"5": 100}),
        ("min_p", 0.05),
        ("min_tokens", 3),
        ("stop_token_ids", [7]),
        ("ignore_eos", True),
    ],
)
def test_served_logits_processing_fields_are_accepted(field, value):
    s = parse({"id": "x", "prompt": "hi", field: value})
    assert s.error is None and s.sampling == {field: value}
    o = parse(oai({field: value}), O)
    assert o.error is None and o.sampling == {field: value}
    assert field not in NOT_SERVED


def test_near_misses_of_served_fields():
    assert "did you mean 'body.min_tokens'?" in parse(oai({"min_token": 3}), O).error.message


def test_refused_lines_in_a_real_run_get_one_record_each(model_dir, tmp_path):
    lines = [
        {"id": "ok", "prompt": "The court held that", "adapter": "legal", "max_tokens": 6},
        {"id": "alias", "prompt": "The court held that", "model": "legal", "max_tokens": 6},
        {"id": "noop", "prompt": "The court held that", "adapter": "legal", "max_tokens": 6, "n": 1, "logit_bias": {}},
        {
            "id": "bias",
            "prompt": "The court held that",
            "adapter": "legal",
            "logit_bias": {"5": 100},
            "top_logprobs": 2,
        },
        {"id": "rep", "prompt": "The court held that", "repetition_penalty": 1.3, "max_tokens": 6},
        {"id": "hf", "prompt": "The court held that", "max_new_tokens": 6},
        {"id": "clash", "prompt": "The court held that", "model": "legal", "adapter": "medical"},
        {"id": "base", "prompt": "The court held that", "max_tokens": 6, "frequency_penalty": 0, "meta": "x"},
    ]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["run", str(inp), "-m", str(model_dir / "base"), "-a", f"legal={model_dir / 'legal'}"]
    rc, _, stderr = run_cli([*args, "-a", f"medical={model_dir / 'medical'}", "--device", "cpu", "-o", str(out)])
    assert rc == 3, stderr
    recs = {r["id"]: r for r in read_jsonl(out)}
    assert list(recs) == [x["id"] for x in lines]
    codes = {i: r["error"]["code"] for i, r in recs.items() if "error" in r}
    assert codes == {"bias": "unsupported_field", "hf": "unknown_field", "clash": "invalid_request"}
    assert recs["bias"]["error"]["message"].startswith(f"line 4: field 'top_logprobs' {TAIL}")
    assert recs["rep"]["text"] and recs["rep"]["adapter"] is None
    assert recs["ok"]["text"] == recs["alias"]["text"] == recs["noop"]["text"]
    assert recs["alias"]["adapter"] == "legal" and recs["base"]["adapter"] is None
