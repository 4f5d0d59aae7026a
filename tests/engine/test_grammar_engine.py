"""Structured output through the real engine on CPU (fp32), on the demo's trained model and its PEFT adapters:
every constrained output that finishes parses and validates (jsonschema) / matches its regex / is one of its
choices, on every adapter row, greedy and sampled; free rows in a mixed batch get exactly what they get alone;
an invalid schema or regex fails its own request only; `n` samples each follow the grammar (sample 0 is the
request with n=1); run-ahead and preemption change no output; a grammar cut by max_tokens says "length"."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.constraint import Constraint, parse_constraint
from multilora_cli.demo.build import DemoSpec, build_demo
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request

ADAPTERS = (None, "legal", "medical", "code")
PROMPTS = ("Summarize the contract clause.", "Describe the patient's symptoms.", "def add(a, b):")
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 8},
                    "age": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["name", "age"],
                "additionalProperties": False,
            }
        },
        "required": ["person"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"label": {"enum": ["pos", "neg", "neutral"]}, "score": {"type": "integer", "maximum": 9}},
        "required": ["label"],
        "additionalProperties": False,
    },
    "array": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
    "numbers": {
        "type": "object",
        "properties": {"x": {"type": "number", "minimum": 0, "maximum": 1}, "ok": {"type": "boolean"}},
        "required": ["x", "ok"],
        "additionalProperties": False,
    },
    "nullable": {
        "type": "object",
        "properties": {
            "note": {"type": ["string", "null"], "maxLength": 5},
            "tags": {"type": "array", "maxItems": 2, "items": {"enum": ["a", "b"]}},
        },
        "required": ["note", "tags"],
        "additionalProperties": False,
    },
}
REGEXES = (r"[0-9]{3}-[a-z]{2,4}", r"(yes|no), [a-z ]{1,10}\.", r"[A-Z][a-z]{0,6}")
CHOICES = (["yes", "no", "maybe so"], ["legal", "medical", "code"])


def build(out):
    """The demo (tiny training budget: a few seconds) in `out`: its base and the three adapters."""
    build_demo(
        out, spec=DemoSpec(base_steps=3, adapter_steps=2, lines_per_domain=40, chats_per_domain=12, vocab_size=512)
    )
    return out / "base", {n: out / n for n in ADAPTERS if n}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return build(tmp_path_factory.mktemp("grammar") / "demo")


def engine(demo, **kw) -> Engine:
    base, adapters = demo
    return Engine(EngineConfig(model=str(base), device="cpu", max_loras=3, max_lora_rank=16, seed=3, **kw), adapters)


def schema_constraint(schema) -> Constraint:
    rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}}
    return parse_constraint({"response_format": rf})


def req(key: int, constraint: Constraint | None, adapter=None, prompt=PROMPTS[0], **sp) -> Request:
    sampling = SamplingParams(**{"max_tokens": 48, "constraint": constraint, **sp})
    return Request(key=key, id=f"r{key}", adapter=adapter, prompt=prompt, sampling=sampling)


def check(c: Constraint, text: str) -> None:
    """`text` satisfies `c` (a finished output)."""
    if c.kind == "json_schema":
        jsonschema.validate(json.loads(text), json.loads(c.source))
    elif c.kind == "json_object":
        assert isinstance(json.loads(text), dict), text
    elif c.kind == "regex":
        assert re.fullmatch(c.source, text), (c.source, text)
    else:
        assert text in json.loads(c.source), text


def constrained_requests() -> list[Request]:
    """Every constraint on every adapter row (cycled), greedy and sampled."""
    cons = [schema_constraint(s) for s in SCHEMAS.values()]
    cons += [Constraint("json_object")] + [Constraint("regex", r) for r in REGEXES]
    cons += [parse_constraint({"choice": ch}) for ch in CHOICES]
    out = []
    for i, c in enumerate(cons * 2):
        hot = dict(temperature=1.0, top_p=0.95, seed=i) if i >= len(cons) else {}
        out.append(req(i, c, ADAPTERS[i % 4], PROMPTS[i % 3], **hot))
    return out


def test_every_finished_output_satisfies_its_constraint(demo):
    # reads on the step loop's thread: whether a step runs ahead depends on which rows run together, which with
    # background reads depends on read timing
    eng = engine(demo, prefetch_threads=0)
    reqs = constrained_requests()
    results = eng.generate_all(reqs)
    stopped = 0
    for r, q in zip(results, reqs):
        assert r.error is None, r.error
        if r.finish_reason == "stop":
            check(q.sampling.constraint, r.text)
            stopped += 1
        else:
            assert r.finish_reason == "length" and r.completion_tokens == 48
    assert stopped >= len(reqs) - 4, [(r.finish_reason, r.text) for r in results]  # the grammars do end
    assert eng.stats.ahead_steps > 0  # the run-ahead path ran with constrained rows
    assert len(eng.grammar.compiler.compile_seconds) == len(reqs) // 2  # compiled once per distinct constraint


def test_free_rows_in_a_mixed_batch_are_what_they_are_alone(demo):
    free = [req(100 + i, None, ADAPTERS[i % 4], PROMPTS[i % 3], max_tokens=12, ignore_eos=True) for i in range(4)]
    free += [
        req(110 + i, None, ADAPTERS[i % 4], PROMPTS[i % 3], max_tokens=12, temperature=0.9, seed=i) for i in range(4)
    ]
    alone = engine(demo).generate_all(free)
    mixed = engine(demo).generate_all(constrained_requests() + free)
    got = {r.key: r for r in mixed}
    for r in alone:
        assert (got[r.key].token_ids, got[r.key].text, got[r.key].finish_reason) == (
            r.token_ids,
            r.text,
            r.finish_reason,
        )


def test_invalid_schema_or_regex_fails_its_line_only(demo):
    eng = engine(demo)
    bad_schema = schema_constraint({"type": "object", "properties": {"a": {"type": "no-such-type"}}})
    reqs = [
        req(0, Constraint("regex", "[a-z")),
        req(1, bad_schema),
        req(2, Constraint("regex", "[a-c]{2}")),
        req(3, None, max_tokens=4),
    ]
    r = eng.generate_all(reqs)
    assert [x.error.code if x.error else None for x in r] == ["invalid_constraint", "invalid_constraint", None, None]
    assert "regex constraint does not compile" in r[0].error.message
    assert re.fullmatch("[a-c]{2}", r[2].text) and r[2].finish_reason == "stop"


def test_n_samples_each_follow_the_grammar_and_sample_zero_is_n1(demo):
    c = schema_constraint(SCHEMAS["enum"])
    hot = dict(temperature=1.2, seed=7)
    eng = engine(demo)
    (four,) = eng.generate_all([req(0, c, "legal", n=4, **hot)])
    (one,) = eng.generate_all([req(0, c, "legal", **hot)])
    assert four.samples[0].token_ids == one.token_ids
    for s in four.samples:
        if s.finish_reason == "stop":
            check(c, s.text)
    assert len({s.text for s in four.samples}) > 1


@pytest.mark.slow
def test_run_ahead_and_preemption_change_no_output(demo):
    reqs = constrained_requests()
    want = [(r.token_ids, r.finish_reason) for r in engine(demo, run_ahead=False).generate_all(reqs)]
    tight = engine(
        demo,
        block_size=4,
        num_kv_blocks=40,
        max_num_seqs=8,
        # reads on the step loop's thread: which rows run together (so whether the cache overflows)
        # must not depend on read timing
        prefetch_threads=0,
    )
    got = [(r.token_ids, r.finish_reason) for r in tight.generate_all(reqs)]
    assert tight.stats.preemptions > 0
    assert got == want


def test_max_tokens_before_the_grammar_ends_is_length(demo):
    c = schema_constraint(
        {"type": "object", "properties": {"s": {"type": "string", "minLength": 50}}, "required": ["s"]}
    )
    (r,) = engine(demo).generate_all([req(0, c, max_tokens=5)])
    assert r.finish_reason == "length" and r.completion_tokens == 5 and r.text.startswith('{"s":')
    with pytest.raises(json.JSONDecodeError):  # README: a line cut by max_tokens may not parse
        json.loads(r.text)
