"""`multilora run` on prompts far beyond --max-model-len: refused before they are tokenized (a 5 MB line took
~8 s and ~2 GB to encode), each with the same one-line `prompt_too_long` record as before, in its place; a prompt
that passes the cheap bytes bound still gets the scheduler's exact count.
"""

from __future__ import annotations

import json

import pytest

from tests.run.helpers import read_jsonl, run_cli, write_jsonl

HUGE = "the court held that the tenant shall pay " * 25_000  # ~1 MB; the bound is 96 tokens * 19 bytes
LONG = "the court held that the tenant shall pay " * 40  # 1,640 bytes: under the bound, over 96 tokens


@pytest.fixture
def encoded(monkeypatch) -> list[int]:
    """Lengths of the texts the real tokenizer is asked to encode."""
    from multilora_cli.engine.tokenizer import Tokenizer

    seen: list[int] = []
    real = Tokenizer.encode

    def counting(self, text, add_special_tokens=True):
        seen.append(len(text))
        return real(self, text, add_special_tokens)

    monkeypatch.setattr(Tokenizer, "encode", counting)
    return seen


def args(model_dir, *extra):
    return [
        "-m",
        str(model_dir / "base"),
        "--adapter-dir",
        str(model_dir),
        "--device",
        "cpu",
        "--max-model-len",
        "96",
        "-q",
        "--max-tokens",
        "4",
        *extra,
    ]


def test_huge_prompts_get_their_error_record_without_being_encoded(model_dir, tmp_path, encoded):
    rows = [
        {"id": "ok-1", "prompt": "The court held that", "adapter": "legal"},
        {"id": "huge", "prompt": HUGE, "adapter": "legal"},
        {"id": "huge-chat", "messages": [{"role": "user", "content": HUGE}], "adapter": "medical"},
        {"id": "long", "prompt": LONG},
        {"id": "ok-2", "messages": [{"role": "user", "content": "How do I run the tests?"}], "adapter": "code"},
    ]
    inp, errors = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "err.jsonl"
    rc, stdout, stderr = run_cli(["run", str(inp), *args(model_dir, "--errors", str(errors))])
    assert rc == 3, stderr  # finished, with error records: as before
    recs = read_jsonl(stdout)
    assert [r["id"] for r in recs] == [r["id"] for r in rows]
    assert "error" not in recs[0] and "error" not in recs[4] and recs[0]["text"] and recs[4]["text"]
    for i in (1, 2):
        err = recs[i]["error"]
        assert set(recs[i]) == {"id", "adapter", "error"} and err["code"] == "prompt_too_long"
        assert err["message"].startswith(f"line {i + 1}: prompt is too long: its "), err
        assert "max_model_len is 96" in err["message"] and "raise --max-model-len" in err["message"]
    assert recs[3]["error"]["code"] == "prompt_too_long"  # counted, then refused by the scheduler
    assert recs[3]["error"]["message"].startswith("line 4: prompt has ")
    assert read_jsonl(errors) == recs[1:4]
    assert encoded and max(encoded) < 2 * len(LONG)  # the huge texts never reached the tokenizer


def test_openai_batch_lines_too(model_dir, tmp_path, encoded):
    rows = [
        {
            "custom_id": "big",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "legal", "prompt": HUGE, "max_tokens": 4},
        },
        {
            "custom_id": "small",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "legal", "prompt": "The court held that", "max_tokens": 4},
        },
    ]
    rc, stdout, stderr = run_cli(["run", str(write_jsonl(tmp_path / "b.jsonl", rows)), *args(model_dir)])
    assert rc == 3, stderr
    big, small = read_jsonl(stdout)
    assert big["custom_id"] == "big" and big["response"] is None
    assert big["error"]["code"] == "prompt_too_long" and "prompt is too long" in big["error"]["message"]
    assert small["error"] is None and small["response"]["status_code"] == 200
    assert max(encoded) < len(json.dumps(rows[1]))
