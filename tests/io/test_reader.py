"""Streaming input: blank lines skipped, format detected, nothing read ahead beyond what is asked for."""

from __future__ import annotations

import gzip
import io
import json

import pytest

from multilora_cli.errors import InputError
from multilora_cli.io.line import OPENAI, SIMPLE
from multilora_cli.io.reader import (
    CHAT_SLACK,
    LINE_SLACK,
    InputReader,
    count_records,
    count_sequences,
    open_input,
    prompt_token_bound,
)


class CountingStream(io.RawIOBase):
    """A binary stream producing `n` JSON lines on demand and counting how many were handed out."""

    def __init__(self, n: int):
        self.n, self.made, self._buf = n, 0, b""

    def readable(self):
        return True

    def readinto(self, b):
        while len(self._buf) < len(b) and self.made < self.n:
            self.made += 1
            self._buf += json.dumps({"id": self.made, "prompt": "p" * 10}).encode() + b"\n"
        k = min(len(b), len(self._buf))
        b[:k], self._buf = self._buf[:k], self._buf[k:]
        return k


def reader(data: bytes) -> InputReader:
    return InputReader(io.BytesIO(data), "t")


def test_blank_lines_skipped_keys_contiguous_linenos_physical():
    r = reader(b'\n{"prompt": "a"}\n   \n\r\n{"prompt": "b"}\r\n\n')
    assert r.format.name == SIMPLE and not r.empty
    specs = list(r)
    assert [(s.key, s.lineno, s.id) for s in specs] == [(0, 2, 2), (1, 5, 5)]
    assert [s.prompt for s in specs] == ["a", "b"]


def test_utf8_bom_and_no_trailing_newline():
    specs = list(reader(b'\xef\xbb\xbf{"id": "x", "prompt": "a"}'))
    assert specs[0].error is None and specs[0].id == "x"


def test_a_bom_on_a_later_line_is_dropped_too():
    # `cat a.jsonl b.jsonl` with b saved by a BOM-writing editor: its first line used to be invalid_json.
    specs = list(reader(b'{"id": "a", "prompt": "x"}\n\xef\xbb\xbf{"id": "b", "prompt": "y"}\n\xef\xbb\xbf\r\n'))
    assert [(s.id, s.error) for s in specs] == [("a", None), ("b", None)]  # a line of only a BOM is blank


def test_empty_and_blank_only_inputs():
    assert reader(b"").empty and list(reader(b"")) == []
    assert reader(b"\n \n\t\n").empty


def test_openai_detected_even_after_a_malformed_first_line():
    line = json.dumps({"custom_id": "c1", "url": "/v1/completions", "body": {"model": "m", "prompt": "x"}})
    r = reader(b"{oops\n" + line.encode() + b"\n")
    assert r.format.name == OPENAI
    specs = list(r)
    assert specs[0].error.code == "invalid_json" and specs[0].id is None
    assert specs[1].error is None and specs[1].id == "c1"


def test_a_simple_line_keeping_custom_id_as_metadata_stays_simple():
    # README: other fields are metadata. A custom_id beside a prompt (no body) made the whole file OpenAI batch
    # and every line failed with "url None is not supported".
    r = reader(b'{"id": "a", "prompt": "x", "custom_id": "crm-1"}\n{"id": "b", "prompt": "y"}\n')
    assert r.format.name == SIMPLE
    assert [(s.id, s.prompt, s.error) for s in r] == [("a", "x", None), ("b", "y", None)]
    assert reader(b'{"custom_id": "c1", "url": "/v1/completions"}\n').format.name == OPENAI  # no body: its error


def test_streaming_reads_only_what_is_consumed():
    stream = CountingStream(1_000_000)
    r = InputReader(io.BufferedReader(stream, buffer_size=1 << 16), "big")
    it = iter(r)
    for _ in range(10):
        next(it)
    assert stream.made < 5000  # a buffer's worth, not the million lines


def test_open_input_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        open_input(str(tmp_path / "nope.jsonl"))
    with pytest.raises(InputError, match="is a directory"):
        open_input(str(tmp_path))


def test_count_records(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_bytes(b'\xef\xbb\xbf\n{"prompt":"a"}\n\n{"prompt":"b"}\n  \n{"prompt":"c"}')
    assert count_records(str(p)) == 3  # the progress total counts what the reader yields: a BOM line is blank
    assert count_records("-") is None


def test_count_sequences_bounds_what_the_lines_can_decode_at_once(tmp_path):
    p = tmp_path / "in.jsonl"
    lines = [
        '{"prompt": "a"}',
        '{"prompt": "b", "n": 4}',
        '{"custom_id": "c", "body": {"model": "x", "prompt": "c", "n": 3}}',
        '{"prompt": "d", "n": 0}',  # an invalid n fails its line: it decodes nothing, counted as one
        '{"prompt": "e", "n": true}',
        '{"prompt": "f", "stop": "\\"n\\""}',  # mentions "n" without asking for samples
        '{"prompt": "g", "n": 5',  # unreadable: the bound must not fall short
        "",
    ]
    p.write_text("\n".join(lines) + "\n")
    assert count_sequences(str(p)) == 1 + 4 + 3 + 1 + 1 + 1 + 128
    assert count_sequences("-") is None
    assert count_sequences(str(tmp_path / "missing.jsonl")) is None


def test_prompt_token_bound_counts_text_bytes_ids_and_chats(tmp_path):
    p = tmp_path / "in.jsonl"
    msgs = [{"role": "user", "content": "hé"}]
    lines = [
        '{"prompt": "abc"}',
        '{"prompt": "hé", "continuation": " x"}',  # a scoring line: prompt + continuation, UTF-8 bytes
        json.dumps({"messages": msgs}),
        '{"prompt": "bad", "temperature": "hot"}',  # fails as it is parsed later: still counted (a bound)
        '{"prompt": 3}',  # an error record runs nothing
        "",
    ]
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    chat = len(json.dumps(msgs, ensure_ascii=False).encode()) + CHAT_SLACK
    assert prompt_token_bound(str(p)) == 3 + LINE_SLACK + 5 + LINE_SLACK + chat + 3 + LINE_SLACK
    batch = tmp_path / "batch.jsonl"  # the OpenAI batch format, detected as the reader does; token-id prompts
    body = {"model": "m", "prompt": "xy"}
    rows = [{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body}]
    rows.append({**rows[0], "custom_id": "b", "body": {**body, "prompt": [5, 6, 7, 8]}})
    batch.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert prompt_token_bound(str(batch)) == 2 + LINE_SLACK + 4
    assert prompt_token_bound(str(p), max_bytes=10) is None  # a large input: no estimate
    assert prompt_token_bound(str(p), enough=12) == 3 + LINE_SLACK + 5 + LINE_SLACK  # stops once past `enough`
    assert prompt_token_bound("-") is None and prompt_token_bound(str(tmp_path / "missing.jsonl")) is None


@pytest.mark.parametrize(
    "data, words",
    [
        (gzip.compress(b'{"id": "a", "prompt": "x"}\n'), "gzip-compressed"),
        (b"(\xb5/\xfd\x00\x00garbage", "zstd-compressed"),
        (b"\x00\x00\x00\x00\n{}\n", "binary file"),
        (bytes(range(128, 256)) + b"\n" + b'{"prompt": "x"}\n', "binary file"),
    ],
)
def test_compressed_or_binary_input_is_one_fatal_error(data, words):
    # These used to become one invalid_utf8 record per garbage "line" (exit 3); a .jsonl.gz is a common slip.
    with pytest.raises(InputError, match=words) as e:
        InputReader(io.BytesIO(data), "in.bin")
    assert e.value.exit_code == 1 and "in.bin" in e.value.message


def test_a_latin1_line_is_still_a_per_line_error():
    # A JSON line in another encoding starts with "{": one bad record, the rest of the file still runs.
    r = InputReader(io.BytesIO(b'{"id": "l", "prompt": "caf\xe9"}\n{"id": "ok", "prompt": "x"}\n'), "in")
    specs = list(r)
    assert specs[0].error.code == "invalid_utf8" and specs[1].error is None


def test_cr_only_line_endings_are_named_in_the_error():
    # Old-Mac CR-only files are one "line" to a \n reader; the bare "Extra data" error did not say why.
    specs = list(reader(b'{"id": "a", "prompt": "x"}\r{"id": "b", "prompt": "y"}\r'))
    assert len(specs) == 1 and specs[0].error.code == "invalid_json"
    assert "CR-only line endings" in specs[0].error.message and "tr '\\r' '\\n'" in specs[0].error.message
