"""`multilora run` end to end with the logits-processing fields: a line using each one, in the simple format and
in OpenAI batch bodies (completions and chat), the CLI flags under the lines' own values, and bad values as an
error record (a line) or exit 2 (a flag). The tiny model of tests/run/helpers.py: eos ids 1 and 4, 400 tokens."""

from __future__ import annotations

import pytest

from tests.run.helpers import read_jsonl, run_cli, write_jsonl

EOS = 1
T = 57  # an ordinary token
PROMPT = "The court held that the"
FREE = {"ignore_eos": True}  # the adapter's greedy text stops at eos early: run to max_tokens to see the effects
LINES = {  # id -> fields beside the prompt
    "plain": FREE,
    "rep": {"repetition_penalty": 0.3, **FREE},  # below 1 favours repeats: this random model never repeats unpushed
    "freq": {"frequency_penalty": -2.0, **FREE},
    "pres": {"presence_penalty": -2.0, **FREE},
    "bias": {"logit_bias": {str(T): 100}},
    "min_p": {"temperature": 2.0, "min_p": 1.0, "seed": 3, **FREE},  # only the top token is kept: greedy
    "min_tokens": {"logit_bias": {str(EOS): 100}, "min_tokens": 5},
    "stop_id": {"logit_bias": {str(T): 100}, "stop_token_ids": [T]},
    "ignore_eos": {"logit_bias": {str(EOS): 100}, "ignore_eos": True, "max_tokens": 4},
}


def args(model_dir, inp):
    return ["run", str(inp), "-m", str(model_dir / "base"), "-a", f"legal={model_dir / 'legal'}", "--device", "cpu"]


def check(by: dict, text: callable, usage: callable, finish: callable) -> None:
    """The effect of each line of LINES, read through the format's accessors."""
    plain = text(by["plain"])
    for i in ("rep", "freq", "pres"):
        assert text(by[i]) != plain, i
    assert usage(by["bias"]) == 16 and finish(by["bias"]) == "length"  # generation_config: max_new_tokens 16
    assert text(by["min_p"]) == plain
    assert (usage(by["min_tokens"]), finish(by["min_tokens"])) == (6, "stop")  # eos right at min_tokens
    assert (usage(by["stop_id"]), finish(by["stop_id"]), text(by["stop_id"])) == (1, "stop", "")
    assert (usage(by["ignore_eos"]), finish(by["ignore_eos"]), text(by["ignore_eos"])) == (4, "length", "")


def test_simple_lines_with_each_field(model_dir, tmp_path):
    inp = write_jsonl(
        tmp_path / "in.jsonl", [{"id": i, "adapter": "legal", "prompt": PROMPT, **f} for i, f in LINES.items()]
    )
    rc, out, err = run_cli([*args(model_dir, inp), "-q"])
    assert rc == 0, err
    by = {r["id"]: r for r in read_jsonl(out)}
    assert list(by) == list(LINES)
    check(by, lambda r: r["text"], lambda r: r["usage"]["completion_tokens"], lambda r: r["finish_reason"])
    bias_text = by["bias"]["text"].split()
    assert len(set(bias_text)) == 1  # the biased token, over and over


@pytest.mark.parametrize("url", ["/v1/completions", "/v1/chat/completions"])
def test_openai_bodies_with_each_field(model_dir, tmp_path, url):
    chat = url.endswith("chat/completions")
    ask = {"messages": [{"role": "user", "content": PROMPT}]} if chat else {"prompt": PROMPT}
    rows = [
        {"custom_id": i, "method": "POST", "url": url, "body": {"model": "legal", **ask, **f}} for i, f in LINES.items()
    ]
    inp = write_jsonl(tmp_path / "batch.jsonl", rows)
    rc, out, err = run_cli([*args(model_dir, inp), "-q"])
    assert rc == 0, err
    by = {r["custom_id"]: r for r in read_jsonl(out)}
    assert all(r["error"] is None for r in by.values())

    def choice(r):
        return r["response"]["body"]["choices"][0]

    check(
        by,
        lambda r: choice(r)["message"]["content"] if chat else choice(r)["text"],
        lambda r: r["response"]["body"]["usage"]["completion_tokens"],
        lambda r: choice(r)["finish_reason"],
    )


def test_flags_fill_in_what_lines_leave_out(model_dir, tmp_path):
    rows = [
        {"id": "a", "prompt": PROMPT},
        {"id": "own", "prompt": PROMPT, "repetition_penalty": 1.0},
        {"id": "oov", "prompt": PROMPT, "logit_bias": {"400": 5}},  # outside the 400-token vocabulary
    ]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)

    def run(*flags):
        rc, out, err = run_cli([*args(model_dir, inp), "-q", *flags])
        assert rc == 3, err
        recs = {r["id"]: r for r in read_jsonl(out)}
        assert recs["oov"]["error"]["code"] == "invalid_sampling"
        assert (
            "logit_bias names token id 400, outside the model's vocabulary (ids 0..399)"
            in (recs["oov"]["error"]["message"])
        )
        return recs

    plain = run()
    flagged = run("--repetition-penalty", "0.3", "--min-p", "0.0", "--min-tokens", "2", "--frequency-penalty", "0")
    assert flagged["a"]["text"] != plain["a"]["text"] and flagged["own"]["text"] == plain["own"]["text"]
    pushed = run("--presence-penalty", "-2", "--frequency-penalty", "-2")
    assert pushed["a"]["text"] != plain["a"]["text"]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--min-p", "2"], "--min-p"),
        (["--frequency-penalty", "3"], "--frequency-penalty"),
        (["--presence-penalty", "-2.5"], "--presence-penalty"),
        (["--repetition-penalty", "0"], "--repetition-penalty must be a finite number > 0"),
        (["--min-tokens", "-1"], "--min-tokens"),
        (["--min-tokens", "9", "--max-tokens", "8"], "--min-tokens must be <= max_tokens, got 9 > 8"),
    ],
)
def test_bad_flags_exit_2(model_dir, tmp_path, flags, words):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"prompt": PROMPT}])
    rc, out, err = run_cli([*args(model_dir, inp), *flags])
    assert rc == 2 and out == b"" and words in err, err
