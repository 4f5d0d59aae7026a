"""--resume bookkeeping (io/resume.py): torn last line dropped, prefix proven to belong to the input, kept errors
copied; and the writer flushes a record's ledger line before the record."""

from __future__ import annotations

import io
import json

import pytest

from multilora_cli.errors import OutputError
from multilora_cli.io.reader import InputReader
from multilora_cli.io.resume import scan_output, truncate_torn, verify_prefix
from multilora_cli.io.writer import OrderedWriter, open_output


def simple_input(n, ids=None):
    ids = ids or [f"r{i}" for i in range(n)]
    return InputReader(io.BytesIO(b"".join(json.dumps({"id": i, "prompt": "x"}).encode() + b"\n" for i in ids)))


def rec(i, error=False):
    r = {"id": i, "adapter": None}
    if error:
        r["error"] = {"code": "x", "message": "m"}
    else:
        r.update(text="t", finish_reason="stop", usage={"prompt_tokens": 1, "completion_tokens": 1})
    return json.dumps(r) + "\n"


def test_torn_line_found_and_truncated_after_verification(tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_text(rec("r0") + rec("r1", error=True) + '{"id": "r2", "adap')
    plan = scan_output(str(out))
    assert plan.exists and plan.torn_bytes == len('{"id": "r2", "adap')
    r = simple_input(5)
    specs = iter(r)
    sink = io.BytesIO()
    verify_prefix(plan, specs, r.format, sink)
    assert (plan.kept, plan.kept_errors) == (2, 1)
    assert json.loads(sink.getvalue())["id"] == "r1"
    assert next(specs).id == "r2"  # the iterator continues right after the kept prefix
    assert out.read_text().endswith('"adap')  # verification alone modifies nothing
    truncate_torn(plan)
    assert out.read_text() == rec("r0") + rec("r1", error=True)


def test_missing_output_means_fresh_start(tmp_path):
    plan = scan_output(str(tmp_path / "none.jsonl"))
    r = simple_input(2)
    assert not plan.exists and verify_prefix(plan, iter(r), r.format).kept == 0


def test_big_output_scanned_backwards(tmp_path):
    out = tmp_path / "o.jsonl"
    body = "".join(rec(f"r{i}") for i in range(3000))
    out.write_text(body + "x" * 100)
    plan = scan_output(str(out))
    assert plan.valid_bytes == len(body.encode()) and plan.torn_bytes == 100
    r = simple_input(3000)
    assert verify_prefix(plan, iter(r), r.format).kept == 3000


@pytest.mark.parametrize(
    "content, ids, words",
    [
        (rec("r0") + rec("zz"), None, 'record 2 has id "zz" but input line 2 has id "r1"'),
        (rec("r0") + rec("r1") + rec("r2"), ["r0", "r1"], "more records"),
        (rec(1), [1], None),  # ok: same integer id
        (rec("1"), [1], "record 1 has id"),  # "1" is not 1: a different input
        ('{"custom_id": "r0", "response": null, "error": null}\n', None, "not a multilora record of the simple format"),
        ("not json\n", None, "not a multilora record of the simple format"),
    ],
)
def test_mismatches_refuse_with_a_clear_message(tmp_path, content, ids, words):
    out = tmp_path / "o.jsonl"
    out.write_text(content)
    r = simple_input(len(ids) if ids else 3, ids)
    plan = scan_output(str(out))
    if words is None:
        verify_prefix(plan, iter(r), r.format)
        return
    with pytest.raises(OutputError, match="--resume") as e:
        verify_prefix(plan, iter(r), r.format)
    assert words in e.value.message and e.value.exit_code == 1
    assert out.read_text() == content  # untouched


def test_the_ledger_line_is_flushed_before_its_record(tmp_path):
    out_p = tmp_path / "o.jsonl"
    out, _ = open_output(str(out_p))
    seen = []

    class Ledger(io.BytesIO):
        def flush(self):
            seen.append((self.getvalue().count(b"\n"), out_p.read_bytes().count(b"\n")))

    led = Ledger()
    w = OrderedWriter(out, ledger=led)
    w.put(1, {"id": 1}, tag="b 1")
    assert led.getvalue() == b"" and seen == []
    w.put(0, {"id": 0}, tag="a 0")
    assert led.getvalue() == b"a 0\nb 1\n" and seen == [(2, 0)]  # both ledger lines out, no record yet
    assert [json.loads(x)["id"] for x in out_p.read_text().splitlines()] == [0, 1]
    with pytest.raises(OutputError, match="without its ledger line"):
        w.put(2, {"id": 2})
