"""run/line_kinds.py: the facts a run reads off a small input before its engine starts (the LineKinds of the lines
that run, their exact prompt tokens), and how they reach the EngineConfig the precompile is planned from."""

from __future__ import annotations

from pathlib import Path

from multilora_cli.config import LineKind
from multilora_cli.engine.tokenizer import Tokenizer
from multilora_cli.io.sampling import SamplingFlags
from multilora_cli.run.config import EngineFlags, RunConfig, base_aliases
from multilora_cli.run.line_kinds import read_input_facts
from tests.run.helpers import write_jsonl

LINES = [
    {"adapter": "legal", "prompt": "The court held that"},
    {"prompt": "Here is one example:", "temperature": 0.7, "top_k": 20},
    {"adapter": "base", "messages": [{"role": "user", "content": "Give me an example."}], "logit_bias": {"5": 1}},
    {"adapter": "legal", "prompt": "The lease", "continuation": " ended early"},
    {"adapter": "nobody", "prompt": "an unknown adapter: an error record"},
    {"prompt": "bad sampling", "temperature": -1},
]


def _facts(model_dir: Path, path: Path, flags=None, **kw):
    base = model_dir / "base"
    return read_input_facts(str(path), str(base), flags, {"legal"}, base_aliases([None], base), {}, **kw)


def test_facts_are_the_running_lines_kinds_and_exact_prompt_tokens(model_dir, tmp_path):
    facts = _facts(model_dir, write_jsonl(tmp_path / "in.jsonl", LINES))
    assert facts.kinds == {
        LineKind(),
        LineKind(base=True, sampled=True, top_k=20),
        LineKind(base=True, bias=True),
        LineKind(prompt_logprobs=0),  # the scoring line: its context + continuation's logprobs
    }
    tok = Tokenizer.from_dir(model_dir / "base")
    want = (
        len(tok.encode("The court held that"))
        + len(tok.encode("Here is one example:"))
        + len(tok.apply_chat_template([{"role": "user", "content": "Give me an example."}]))
        + len(tok.encode("The lease ended early"))
    )
    assert abs(facts.prompt_tokens - want) <= 1  # (the scoring split may merge a token at the boundary)
    assert facts.tokenizer is not None
    # the run's flags and the model's generation_config resolve under the lines' own fields, as in the run
    hot = _facts(model_dir, tmp_path / "in.jsonl", SamplingFlags(temperature=0.5), count_tokens=False)
    assert LineKind(sampled=True) in hot.kinds and hot.prompt_tokens is None and hot.tokenizer is None


def test_no_facts_for_stdin_or_a_large_file(model_dir, tmp_path):
    assert _facts(model_dir, Path("-")) is None
    big = write_jsonl(tmp_path / "big.jsonl", [{"prompt": "x" * 1000}] * 1100)  # over 1 MiB
    assert _facts(model_dir, big) is None


def test_the_facts_reach_the_engine_config(model_dir, tmp_path):
    from multilora_cli.adapters.preflight import preflight
    from multilora_cli.run.setup import engine_config

    inp = write_jsonl(tmp_path / "in.jsonl", LINES[:3])
    run = RunConfig(str(inp), model=str(model_dir / "base"), engine=EngineFlags(device="cpu"))
    pf = preflight({}, str(model_dir / "base"))
    facts = _facts(model_dir, inp)
    econf, _ = engine_config(run, pf, {}, facts.kinds, facts.prompt_tokens)
    assert econf.line_kinds == facts.kinds and econf.prompt_tokens_hint == facts.prompt_tokens
    bound, _ = engine_config(run, pf, {})  # unknown: the byte bound, every kind
    assert bound.line_kinds is None and bound.prompt_tokens_hint > facts.prompt_tokens
