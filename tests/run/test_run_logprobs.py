"""Logprobs, prompt logprobs and scoring through `multilora run` on the tiny model: record shapes in both formats,
a file mixing scoring and generation lines and adapters, OpenAI's echo + max_tokens 0 giving the scoring line's
numbers, bad values as error records beside intact lines, and --resume over such lines. (Exactness against HF +
PEFT: tests/engine/test_engine_logprobs.py.)"""

from __future__ import annotations

import math

import pytest

from multilora_cli.io.ledger import ledger_path
from tests.run.helpers import read_jsonl, run_cli, write_jsonl

CTX, CONT = "The court held that", " the tenant"


def args(model_dir, *extra):
    adapters = [f"{n}={model_dir / n}" for n in ("legal", "medical", "code")]
    return ["-m", str(model_dir / "base"), *[x for a in adapters for x in ("-a", a)], "--device", "cpu", "-q", *extra]


def run(model_dir, inp, *extra) -> tuple[int, list[dict], str]:
    rc, out, err = run_cli(["run", str(inp), *args(model_dir, *extra)])
    return rc, read_jsonl(out), err


def _entry_ok(e: dict, k: int) -> None:
    assert list(e) == ["id", "token", "logprob", "top_logprobs"] and len(e["top_logprobs"]) == k
    assert e["logprob"] <= 0 and all(list(t) == ["id", "token", "logprob"] for t in e["top_logprobs"])
    lps = [t["logprob"] for t in e["top_logprobs"]]
    assert lps == sorted(lps, reverse=True)
    if k:  # the chosen token is never more likely than the top one
        assert e["logprob"] <= lps[0] + 1e-6


def test_simple_records_mixed_scoring_and_generation(model_dir, tmp_path):
    rows = [
        {"id": "g", "prompt": CTX, "adapter": "legal", "max_tokens": 4, "logprobs": 3, "prompt_logprobs": 2},
        {"id": "s", "prompt": CTX, "continuation": CONT, "adapter": "medical"},
        {"id": "n", "prompt": CTX, "adapter": "code", "max_tokens": 3, "n": 2, "temperature": 1.0, "logprobs": 0},
        {"id": "plain", "prompt": CTX, "max_tokens": 3},
        {"id": "sb", "prompt": CTX, "continuation": CONT},
        {"id": "k21", "prompt": CTX, "logprobs": 21},
        {"id": "kneg", "prompt": CTX, "prompt_logprobs": -1},
        {"id": "empty", "prompt": CTX, "continuation": ""},
        {"id": "msgs", "messages": [{"role": "user", "content": "hi"}], "continuation": "x"},
        {"id": "top", "prompt": CTX, "top_logprobs": 2},
    ]
    rc, recs, err = run(model_dir, write_jsonl(tmp_path / "in.jsonl", rows))
    assert rc == 3, err
    g, s, n, plain, sb, k21, kneg, empty, msgs, top = recs
    assert list(g) == ["id", "adapter", "text", "finish_reason", "logprobs", "prompt_logprobs", "usage"]
    assert len(g["logprobs"]) == g["usage"]["completion_tokens"] or g["finish_reason"] == "stop"
    for e in g["logprobs"]:
        _entry_ok(e, 3)
    assert g["prompt_logprobs"][0] is None and len(g["prompt_logprobs"]) == g["usage"]["prompt_tokens"]
    for e in g["prompt_logprobs"][1:]:
        _entry_ok(e, 2)
    assert list(s) == ["id", "adapter", "logprob", "is_greedy", "num_tokens", "token_logprobs"]
    assert s["adapter"] == "medical" and s["num_tokens"] == len(s["token_logprobs"]) > 0
    assert math.isclose(s["logprob"], sum(s["token_logprobs"]), abs_tol=1e-5)
    assert s["logprob"] != sb["logprob"]  # the adapter matters
    assert [len(c["logprobs"]) for c in n["choices"]] == [3, 3] and all(
        not e["top_logprobs"] for c in n["choices"] for e in c["logprobs"]
    )
    assert list(plain) == ["id", "adapter", "text", "finish_reason", "usage"]  # a line that asks nothing: as before
    assert k21["error"]["code"] == kneg["error"]["code"] == "invalid_sampling"
    assert empty["error"]["code"] == "empty_continuation"
    assert msgs["error"]["code"] == "invalid_request" and "'messages'" in msgs["error"]["message"]
    assert top["error"]["code"] == "unsupported_field"


def test_openai_shapes_and_echo_scores_like_a_scoring_line(model_dir, tmp_path):
    def line(cid, url, body):
        return {"custom_id": cid, "method": "POST", "url": url, "body": {"model": "legal", **body}}

    rows = [
        line("c", "/v1/completions", {"prompt": CTX, "max_tokens": 3, "logprobs": 2}),
        line("e", "/v1/completions", {"prompt": CTX + CONT, "max_tokens": 0, "echo": True, "logprobs": 1}),
        line(
            "chat",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "logprobs": True, "top_logprobs": 2},
        ),
        line("bad", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2}),
        line("echochat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "echo": True}),
    ]
    rc, recs, err = run(model_dir, write_jsonl(tmp_path / "in.jsonl", rows))
    assert rc == 3, err
    c, e, chat = (r["response"]["body"]["choices"][0] for r in recs[:3])
    lp = c["logprobs"]
    assert list(lp) == ["tokens", "token_logprobs", "top_logprobs", "text_offset"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert lp["text_offset"][0] == len(CTX) and all(len(t) <= 2 for t in lp["top_logprobs"])
    assert "".join(lp["tokens"]) == c["text"]  # each token's text as it reads in the completion
    assert [o - len(CTX) for o in lp["text_offset"]] == [
        len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))
    ]
    assert e["text"] == CTX + CONT and e["finish_reason"] == "length"
    assert recs[1]["response"]["body"]["usage"]["completion_tokens"] == 0
    elp = e["logprobs"]
    assert elp["token_logprobs"][0] is None and elp["top_logprobs"][0] is None and elp["text_offset"][0] == 0
    content = chat["logprobs"]["content"]
    assert len(content) >= 1 and list(content[0]) == ["token", "logprob", "bytes", "top_logprobs"]
    assert content[0]["bytes"] == list(content[0]["token"].encode()) and len(content[0]["top_logprobs"]) == 2
    assert recs[3]["error"]["code"] == "invalid_sampling" and recs[4]["error"]["code"] == "unsupported_field"
    # the simple format's scoring line gives the same numbers as the echo line's last tokens
    simple = write_jsonl(tmp_path / "s.jsonl", [{"id": "s", "prompt": CTX, "continuation": CONT, "adapter": "legal"}])
    rc, (s,), err = run(model_dir, simple)
    assert rc == 0, err
    tail = elp["token_logprobs"][-s["num_tokens"] :]
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(tail, s["token_logprobs"]))


def test_resume_with_logprobs_and_scoring_lines(model_dir, tmp_path):
    rows = []
    for i in range(5):
        if i % 2:
            rows.append(
                {"id": f"s{i}", "prompt": f"The court held {i}", "continuation": " the tenant", "adapter": "code"}
            )
        else:
            rows.append(
                {"id": f"g{i}", "prompt": f"On Sunday {i}", "max_tokens": 3, "logprobs": 1, "prompt_logprobs": 0}
            )
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    rc, _, err = run_cli(["run", str(inp), *args(model_dir), "-o", str(out)])
    assert rc == 0, err
    full, full_ledger = out.read_bytes(), ledger_path(out).read_bytes()
    lines, tags = full.splitlines(keepends=True), full_ledger.splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:2]) + lines[2][:20])
    ledger_path(out).write_bytes(b"".join(tags[:4]))
    rc, _, err = run_cli(["run", str(inp), *args(model_dir), "-o", str(out), "--resume"])
    assert rc == 0, err
    got, want = read_jsonl(out), read_jsonl(full)
    assert got[:2] == want[:2] and len(got) == len(want)
    # the rerun lines batch differently: the same tokens, logprobs equal to fp32 rounding (not bit for bit)
    for a, b in zip(got[2:], want[2:]):
        assert _numbers(a) == pytest.approx(_numbers(b), abs=1e-4) and _skeleton(a) == _skeleton(b)


def _numbers(rec) -> list[float]:
    if isinstance(rec, dict):
        return [x for k, v in rec.items() for x in ([v] if k in ("logprob",) and v is not None else _numbers(v))]
    if isinstance(rec, list):
        return [
            x
            for v in rec
            for x in (_numbers(v) if isinstance(v, (dict, list)) else [v] if isinstance(v, float) else [])
        ]
    return []


def _skeleton(rec):
    """The record without its float values."""
    if isinstance(rec, dict):
        return {k: _skeleton(v) for k, v in rec.items() if k not in ("logprob",)}
    if isinstance(rec, list):
        return [_skeleton(v) for v in rec if not isinstance(v, float)]
    return rec
