"""Ordered writer: input order, flushed as soon as the head is complete, error copies, no duplicates."""

from __future__ import annotations

import json

import pytest

from multilora_cli.errors import OutputError
from multilora_cli.io.writer import OrderedWriter, check_writable, encode_record, open_output


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_reorders_and_flushes_as_soon_as_next_in_order_completes(tmp_path):
    out_p, err_p = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    out, _ = open_output(str(out_p))
    err, _ = open_output(str(err_p), what="errors file")
    w = OrderedWriter(out, err)
    assert w.put(2, {"id": 2}) == 0 and w.put(1, {"id": 1, "error": {"code": "x"}}, is_error=True) == 0
    assert out_p.read_text() == "" and w.pending == 2
    assert w.put(0, {"id": 0}) == 3  # head complete: 0, 1, 2 go out together...
    assert [r["id"] for r in lines(out_p)] == [0, 1, 2]  # ...and are on disk without close()
    assert [r["id"] for r in lines(err_p)] == [1]
    w.put(4, {"id": 4})
    assert len(lines(out_p)) == 3
    w.put(3, {"id": 3})
    assert [r["id"] for r in lines(out_p)] == [0, 1, 2, 3, 4] and w.pending == 0 and w.written == 5
    with pytest.raises(OutputError, match="written twice"):
        w.put(3, {"id": 3})
    w.close()


def test_start_key_for_resume_and_append(tmp_path):
    p = tmp_path / "o.jsonl"
    p.write_text('{"id": 0}\n')
    out, _ = open_output(str(p), append=True)
    w = OrderedWriter(out, start_key=1)
    w.put(1, {"id": 1})
    w.close()
    assert [r["id"] for r in lines(p)] == [0, 1]


def test_encode_record_unicode_and_lone_surrogates():
    assert encode_record({"text": "é"}) == '{"text": "é"}\n'.encode()
    assert encode_record({"text": "\ud800"}) == b'{"text": "\\ud800"}\n'


def test_unwritable_outputs(tmp_path):
    with pytest.raises(OutputError, match="does not exist|No such file"):
        open_output(str(tmp_path / "missing" / "o.jsonl"))
    with pytest.raises(OutputError, match="is a directory"):
        open_output(str(tmp_path))
    with pytest.raises(OutputError, match="does not exist"):
        check_writable(str(tmp_path / "missing" / "s.json"), "stats file")
    check_writable(str(tmp_path / "s.json"), "stats file")


def test_broken_pipe_is_a_clear_error():
    class Closed:
        def write(self, b):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    w = OrderedWriter(Closed(), out_name="<stdout>")
    with pytest.raises(OutputError, match="closed by the reader"):
        w.put(0, {"id": 0})


def test_a_failing_errors_file_is_named_not_the_output():
    # `--errors /dev/full` (or a closed pipe) said "writing <stdout> failed": the wrong file to go and look at
    class Full:
        def write(self, b):
            raise OSError(28, "No space left on device")

        def flush(self):
            pass

    class Sink:
        def write(self, b):
            return len(b)

        def flush(self):
            pass

    w = OrderedWriter(Sink(), Full(), out_name="<stdout>", errors_name="/dev/full")
    w.put(0, {"id": 0})
    with pytest.raises(OutputError, match="^writing errors file /dev/full failed: No space left on device$"):
        w.put(1, {"id": 1, "error": {"code": "x"}}, is_error=True)
