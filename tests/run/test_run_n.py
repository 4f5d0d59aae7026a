"""`n` through `multilora run` on the tiny model: record shapes in both formats (n=1 records unchanged), stats
counting every sample's tokens and each line once, bad n / best_of as error records beside intact lines, and
--resume keeping or rerunning whole lines of samples."""

from __future__ import annotations

import json

from multilora_cli.io.ledger import ledger_path
from tests.run.helpers import read_jsonl, run_cli, write_jsonl

HOT = {"temperature": 1.5, "seed": 3}


def args(model_dir, *extra):
    return ["-m", str(model_dir / "base"), "-a", f"legal={model_dir / 'legal'}", "--device", "cpu", "-q", *extra]


def run(model_dir, inp, *extra) -> tuple[int, list[dict], str]:
    rc, out, err = run_cli(["run", str(inp), *args(model_dir, *extra)])
    return rc, read_jsonl(out), err


def test_simple_records_with_n_and_stats(model_dir, tmp_path):
    rows = [
        {"id": "one", "prompt": "The court held that", "adapter": "legal", "max_tokens": 6, **HOT},
        {"id": "four", "prompt": "The court held that", "adapter": "legal", "max_tokens": 6, "n": 4, **HOT},
        {"id": "greedy", "prompt": "On Sunday", "max_tokens": 5, "n": 3, "best_of": 3},
        {"id": "greedy1", "prompt": "On Sunday", "max_tokens": 5},
        {"id": "zero", "prompt": "x", "n": 0},
        {"id": "best", "prompt": "x", "n": 2, "best_of": 4},
    ]
    inp, stats = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "stats.json"
    rc, recs, err = run(model_dir, inp, "--stats", str(stats))
    assert rc == 3, err
    one, four, greedy, greedy1, zero, best = recs
    assert list(one) == ["id", "adapter", "text", "finish_reason", "usage"]  # n=1: the record of before
    assert list(four) == ["id", "adapter", "choices", "usage"] and four["adapter"] == "legal"
    assert [c["index"] for c in four["choices"]] == [0, 1, 2, 3]
    assert four["choices"][0] == {"index": 0, "text": one["text"], "finish_reason": one["finish_reason"]}
    assert len({c["text"] for c in four["choices"]}) > 1  # sampled: the samples differ
    assert four["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert [c["text"] for c in greedy["choices"]] == [greedy1["text"]] * 3
    assert greedy["usage"]["completion_tokens"] == 3 * greedy1["usage"]["completion_tokens"]
    assert zero["error"]["code"] == "invalid_sampling" and "n must be an integer in 1..128" in zero["error"]["message"]
    assert best["error"]["code"] == "unsupported_field" and "'best_of' 4 above n (2)" in best["error"]["message"]
    s = json.loads(stats.read_text())
    assert (s["requests"], s["ok"], s["errors"]) == (6, 4, 2)
    ok = [one, four, greedy, greedy1]
    assert s["completion_tokens"] == sum(r["usage"]["completion_tokens"] for r in ok)
    assert s["prompt_tokens"] == sum(r["usage"]["prompt_tokens"] for r in ok)
    assert s["engine"]["requests"] == 4 and s["engine"]["completion_tokens"] == s["completion_tokens"]


def test_openai_records_with_n(model_dir, tmp_path):
    def line(cid, url, body):
        return {"custom_id": cid, "method": "POST", "url": url, "body": {"model": "legal", "max_tokens": 5, **body}}

    rows = [
        line("c1", "/v1/completions", {"prompt": "The court held that", "n": 2, **HOT}),
        line("c2", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "n": 3, **HOT}),
        line("c3", "/v1/completions", {"prompt": "The court held that", **HOT}),
    ]
    rc, recs, err = run(model_dir, write_jsonl(tmp_path / "in.jsonl", rows))
    assert rc == 0, err
    c1, c2, c3 = (r["response"]["body"] for r in recs)
    assert [c["index"] for c in c1["choices"]] == [0, 1] and all("text" in c for c in c1["choices"])
    assert [c["index"] for c in c2["choices"]] == [0, 1, 2]
    assert all(c["message"]["role"] == "assistant" for c in c2["choices"])
    assert c1["choices"][0]["text"] == c3["choices"][0]["text"] and len(c3["choices"]) == 1  # sample 0 == n=1
    for body in (c1, c2):
        u = body["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert u["completion_tokens"] >= len(body["choices"])  # every sample's tokens


def test_resume_keeps_and_reruns_whole_lines_of_samples(model_dir, tmp_path):
    rows = [
        {"id": f"r{i}", "prompt": f"The court held that the {i} tenants", "max_tokens": 5, "n": 1 + i % 3, **HOT}
        for i in range(5)
    ]
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    rc, _, err = run_cli(["run", str(inp), *args(model_dir), "-o", str(out)])
    assert rc == 0, err
    full, full_ledger = out.read_bytes(), ledger_path(out).read_bytes()
    assert [len(r.get("choices", [r])) for r in read_jsonl(out)] == [1, 2, 3, 1, 2]
    lines = full.splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:2]) + lines[2][:20])  # killed while writing the n=3 line
    tags = full_ledger.splitlines(keepends=True)
    ledger_path(out).write_bytes(b"".join(tags[:4]))  # the ledger runs one line ahead of the records
    rc, _, err = run_cli(["run", str(inp), *args(model_dir), "-o", str(out), "--resume"])
    assert rc == 0, err
    assert out.read_bytes() == full and ledger_path(out).read_bytes() == full_ledger
    # n is part of the line: a kept line whose n changed answers another request
    out.write_bytes(b"".join(lines[:2]))
    ledger_path(out).write_bytes(b"".join(tags[:3]))
    rows[1]["n"] = 3
    write_jsonl(inp, rows)
    rc, _, err = run_cli(["run", str(inp), *args(model_dir), "-o", str(out), "--resume"])
    assert rc == 1 and "record 2 answers another request than input line 2" in err, err
