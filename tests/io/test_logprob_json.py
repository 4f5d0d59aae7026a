"""Logprob records written as JSON text (io/logprob_json.py, io/record_json.py) are byte for byte the lines the
dict records gave before: `json.dumps` of the entries as dicts (the functions below are the code that built them,
kept here as the reference), on random entries with unicode, escapes, -inf / nan, null logprobs, repeated top
texts, k 0 / 5 / 20, in both formats' records, and when a user's string holds the splice marker or a lone
surrogate."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

# the dict records as they were built before (run/logprobs.entry + io/logprob_records): the reference the new JSON
# writer must equal byte for byte, kept in the maintained benchmark that times the two side by side
from benchmarks.bench_records import old_chat, old_entry, old_legacy
from multilora_cli.engine.request import TokenLogprob
from multilora_cli.io import logprob_records
from multilora_cli.io.line import LineLogprobs, LineSpec
from multilora_cli.io.logprob_json import TokenJson, numbers_json, numbers_orjson
from multilora_cli.io.openai_batch import CHAT, COMPLETIONS, OpenAIBatchFormat
from multilora_cli.io.record_json import _MARK, RawJson, encode_record, plain_record
from multilora_cli.io.simple import SimpleFormat


def dumps(v) -> str:
    return json.dumps(v, ensure_ascii=False)


# -- random entries ------------------------------------------------------------------------------------------------
PIECES = ["a", " the", "\ufffd", "é", "日本", "🙂", '"', "\\", "\n", "\t", "\x00", "\x1f", "\x7f", "\u2028", "<s>", ""]


def vocab(rng: random.Random, size: int = 60) -> list[str]:
    # a few ids share a text (U+FFFD, ""): OpenAI's {token: logprob} dict then collapses them
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 3))) for _ in range(size)]


def logprob(rng: random.Random) -> float:
    r = rng.random()
    if r < 0.05:
        return -math.inf
    if r < 0.07:
        return math.nan
    if r < 0.1:
        return rng.choice([0.0, -0.0, -1e-7, -1e-30, -123456789.125])
    return -rng.expovariate(0.3)


def entries(rng: random.Random, texts: list[str], n: int, k: int, prompt: bool = False) -> list[TokenLogprob]:
    out = []
    for j in range(n):
        tid = rng.randrange(len(texts))
        lp = None if prompt and j == 0 else logprob(rng)
        top = [] if lp is None else [(i, texts[i], logprob(rng)) for i in rng.sample(range(len(texts)), k)]
        out.append(TokenLogprob(tid, lp, top, texts[tid]))
    return out


CASES = [(seed, k) for seed in range(6) for k in (0, 1, 5, 20)]


@pytest.mark.parametrize("seed,k", CASES)
@pytest.mark.parametrize("distinct", [False, True])
def test_each_shape_is_json_dumps_of_the_old_dicts(seed, k, distinct):
    rng = random.Random(seed * 100 + k)
    texts = vocab(rng)
    if distinct:  # no two ids with one text (completions' sliced path)
        texts = [f"{t}{i}" for i, t in enumerate(texts)]
    tj = TokenJson()
    for _ in range(3):  # the cache filled by earlier calls changes nothing
        gen = entries(rng, texts, rng.randint(0, 12), k)
        prompt = entries(rng, texts, rng.randint(1, 8), k, prompt=True)
        old = [old_entry(t) for t in gen]
        old_prompt = [old_entry(t) for t in prompt]
        assert tj.simple(gen) == dumps(old) == dumps(logprob_records.simple(gen))
        assert (
            tj.simple_prompt(prompt) == dumps([None, *old_prompt[1:]]) == dumps(logprob_records.simple_prompt(prompt))
        )
        at = rng.randint(0, 50)
        both = [*prompt, *gen]
        assert tj.legacy(both, at) == dumps(old_legacy([*old_prompt, *old], at))
        assert tj.legacy(both, at) == dumps(logprob_records.legacy(both, at))
        assert tj.legacy(gen, at) == dumps(old_legacy(old, at))  # (one k throughout: the sliced path)
        assert tj.chat(gen) == dumps(old_chat(old)) == dumps(logprob_records.chat(gen))


def test_a_text_changed_under_an_id_is_escaped_anew():
    tj = TokenJson()
    a = [TokenLogprob(3, -1.0, [(3, "x", -1.0)], "x")]
    b = [TokenLogprob(3, -1.0, [(3, "é\n", -1.0)], "é\n")]
    assert tj.simple(a) == dumps([old_entry(t) for t in a])
    assert tj.simple(b) == dumps([old_entry(t) for t in b])


def test_one_id_with_two_texts_in_a_line_and_ids_sharing_a_text():
    tj = TokenJson()
    line = [TokenLogprob(3, -1.0, [(3, "x", -1.0), (4, "\ufffd", -2.0)], "x"), TokenLogprob(3, -0.5, [], "y")]
    old = [old_entry(t) for t in line]
    assert tj.simple(line) == dumps(old)
    assert tj.chat(line) == dumps(old_chat(old)) and tj.legacy(line, 2) == dumps(old_legacy(old, 2))
    # ids 4 and 5 both read U+FFFD: completions' {token: logprob} keeps one key, at the first place, last value
    shared = [TokenLogprob(9, -0.1, [(4, "\ufffd", -1.0), (9, "é", -1.5), (5, "\ufffd", -3.0)], "é")]
    want = dumps(old_legacy([old_entry(t) for t in shared], 0))
    assert '"top_logprobs": [{"\ufffd": -3.0, "é": -1.5}]' in want and tj.legacy(shared, 0) == want


def test_numbers_are_written_as_json_writes_them():
    values = [0.0, -0.0, 1e-05, -1e16, 0.1, -2.5, -math.inf, math.inf, math.nan, -3.4028234663852886e38, 0, None]
    line = [TokenLogprob(1, v, [(2, "a", w) for w in values[:i]], "b") for i, v in enumerate(values)]
    assert TokenJson().simple(line) == dumps([old_entry(t) for t in line])


def _old_simple_record(spec, text, finish, pt, ct, choices, lp: LineLogprobs) -> dict:
    """The simple format's record as it was built (dict entries)."""
    usage = {"prompt_tokens": pt, "completion_tokens": ct}
    lps = [None if c is None else [old_entry(t) for t in c] for c in lp.choices]
    if choices is not None:
        listed = [{"index": i, "text": t, "finish_reason": f} for i, (t, f) in enumerate(choices)]
        for c, e in zip(listed, lps):
            if e is not None:
                c["logprobs"] = e
        rec = {"id": spec.id, "adapter": spec.adapter, "choices": listed}
    else:
        rec = {"id": spec.id, "adapter": spec.adapter, "text": text, "finish_reason": finish}
        if lps and lps[0] is not None:
            rec["logprobs"] = lps[0]
    if lp.prompt is not None:
        rec["prompt_logprobs"] = [None, *[old_entry(t) for t in lp.prompt[1:]]]
    rec["usage"] = usage
    return rec


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("rid", ["a1", 7, "é\u2028", _MARK, "x" + _MARK, "\ud800"])
def test_simple_records_encode_to_the_old_lines(seed, rid):
    rng = random.Random(seed)
    texts = vocab(rng)
    fmt = SimpleFormat()
    k = rng.choice([0, 5, 20])
    n = rng.choice([1, 1, 3])
    samples = [entries(rng, texts, rng.randint(0, 6), k) if rng.random() < 0.8 else None for _ in range(n)]
    prompt = entries(rng, texts, 4, k, prompt=True) if rng.random() < 0.5 else None
    lp = LineLogprobs(choices=samples, prompt=prompt)
    choices = [("t", "length")] * n if n > 1 else None
    spec = LineSpec(0, 1, rid, adapter=rng.choice([None, "legal", _MARK]))
    rec = fmt.ok_record(spec, "text é", "stop", 4, 5, choices, logprobs=lp)
    old = _old_simple_record(spec, "text é", "stop", 4, 5, choices, lp)
    try:
        want = (json.dumps(old, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        want = (json.dumps(old, ensure_ascii=True) + "\n").encode("ascii")
    assert encode_record(rec) == want
    assert plain_record(rec) == json.loads(want)  # (nan != nan: compared as the JSON that is read back)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("url", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("cid", ["req-1", _MARK, "\ud800"])
def test_openai_records_encode_to_the_old_lines(seed, url, cid):
    rng = random.Random(seed)
    texts = vocab(rng)
    fmt = OpenAIBatchFormat()
    k = rng.choice([0, 5, 20])
    gen = entries(rng, texts, rng.randint(0, 6), k)
    prompt = entries(rng, texts, 4, k, prompt=True)
    echo = "the prompt é" if url == COMPLETIONS and seed % 2 else None
    lp = LineLogprobs(choices=[gen], prompt=prompt if seed % 3 else None, echo=echo)
    spec = LineSpec(0, 1, cid, meta={"url": url, "model": "legal", "prompt_chars": 12})
    rec = fmt.ok_record(spec, " out", "length", 4, len(gen), None, logprobs=lp)
    # the old record: the same record with its logprob objects built from dict entries
    old = json.loads(json.dumps(rec, default=lambda o: "RAW"))
    choice = old["response"]["body"]["choices"][0]
    old_gen, old_prompt = [old_entry(t) for t in gen], [old_entry(t) for t in prompt]
    if url == CHAT:
        choice["logprobs"] = old_chat(old_gen)
    else:
        shown = [*old_prompt, *old_gen] if echo is not None and lp.prompt is not None else old_gen
        choice["logprobs"] = old_legacy(shown, 0 if echo is not None else 12)
    if lp.prompt is not None and echo is None:
        choice["prompt_logprobs"] = [None, *old_prompt[1:]]
    old["response"]["body"]["created"] = rec["response"]["body"]["created"]
    try:
        want = (json.dumps(old, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        want = (json.dumps(old, ensure_ascii=True) + "\n").encode("ascii")
    assert encode_record(rec) == want


def test_a_record_holding_the_marker_itself_is_still_exact():
    raw = RawJson("[1, 2]", lambda: [1, 2])
    rec = {"id": _MARK, "logprobs": raw, "meta": [_MARK, _MARK]}
    assert encode_record(rec) == (json.dumps({**rec, "logprobs": [1, 2]}, ensure_ascii=False) + "\n").encode()
    assert encode_record({"a": raw, "b": raw}) == b'{"a": [1, 2], "b": [1, 2]}\n'
    with pytest.raises(TypeError):
        encode_record({"a": object()})


SPECIAL = [0.0, -0.0, 1e-4, 1e-5, 1.2e-4, 9.999e-5, 1e16, 1e15, 9999999999999998.0, 5e-324, 1e22, 1e-100, 0.1, 123.0]
SPECIAL += [-1.0, -1.1920928955078125e-07, 0, 7, None, -math.inf, math.inf, math.nan, 2**70, True]


@pytest.mark.parametrize("numbers", [numbers_json, pytest.param(numbers_orjson, id="orjson")])
def test_numbers_are_json_dumps_texts(numbers):
    if numbers is numbers_orjson:
        pytest.importorskip("orjson")
    rng = np.random.default_rng(0)
    # every float32 exponent (logprobs come from fp32 rows), then doubles of many magnitudes, then odd values
    mant = rng.integers(1 << 23, 1 << 24, 200).astype(np.float64)
    for e in range(-149, 128, 3):
        v = (-mant * 2.0 ** (e - 23)).astype(np.float32).astype(np.float64)
        values = tuple(v[np.isfinite(v)].tolist())
        assert numbers(values) == json.dumps(values)[1:-1].split(", ")
    for scale in 10.0 ** np.arange(-12.0, 22.0):
        values = tuple((-rng.exponential(scale, 300)).tolist())
        assert numbers(values) == json.dumps(values)[1:-1].split(", ")
    for i in range(len(SPECIAL)):
        values = (-0.5, *SPECIAL[i:], -3.5e-6, None)
        assert numbers(values) == json.dumps(values)[1:-1].split(", ")
