"""--resume through real runs, and the FILE.resume ledger: another input, an edited prompt, other flags or another
adapter are refused; a killed run resumes to the uninterrupted output; an output without a ledger is kept only on
real ids. (The bookkeeping itself, io/resume.py and the writer's ledger lines: tests/io/test_resume.py.)"""

from __future__ import annotations

import json
import shutil

import pytest

from multilora_cli.io.ledger import ledger_path
from tests.run.helpers import run_cli, write_jsonl

# -- the ledger, through real runs of the tiny model ------------------------------------------------------------
NO_IDS = [
    {"prompt": "The court held that"},
    {"prompt": "The weather today is", "adapter": "legal"},
    {"prompt": "On Sunday"},
]
OTHER = [{"prompt": "Totally"}, {"prompt": "different", "adapter": "legal"}, {"prompt": "file"}]
HINT = "drop --resume to overwrite it, or choose another -o"


def args(model_dir, *extra, legal=None):
    return [
        "-m",
        str(model_dir / "base"),
        "-a",
        f"legal={legal or model_dir / 'legal'}",
        "--device",
        "cpu",
        "-q",
        *extra,
    ]


def run_to(model_dir, inp, out, *extra, legal=None):
    rc, stdout, err = run_cli(["run", str(inp), *args(model_dir, *extra, legal=legal), "-o", str(out)])
    assert rc == 0 and stdout == b"", err
    return out.read_bytes()


def interrupt(out, keep: int, ledger: str = "ahead") -> bytes:
    """Leave `out` as a kill would: `keep` whole records and a torn one. The ledger (written first) is a line
    `ahead`, `even` with the records, or ends in a `torn` line."""
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:keep]) + lines[keep][:9])
    led = ledger_path(out)
    if led.exists():
        tags = led.read_bytes().splitlines(keepends=True)
        led.write_bytes(
            b"".join(tags[: 1 + keep + (ledger == "ahead")]) + (tags[1 + keep][:5] if ledger == "torn" else b"")
        )
    return out.read_bytes()


def resume(model_dir, inp, out, *extra, legal=None):
    return run_cli(["run", str(inp), *args(model_dir, *extra, legal=legal), "-o", str(out), "--resume"])


def refused(res, out, before: bytes, *words):
    rc, stdout, err = res
    assert rc == 1 and stdout == b"", err
    assert err.startswith("error: --resume: ") and err.count("\n") == 1 and HINT in err, err
    for w in words:
        assert w in err, err
    assert out.read_bytes() == before  # nothing modified: not even the torn tail


def test_a_run_to_a_file_writes_its_ledger_and_stdout_runs_none(model_dir, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", NO_IDS), tmp_path / "out.jsonl"
    run_to(model_dir, inp, out)
    head, *tags = ledger_path(out).read_text().splitlines()
    assert json.loads(head)["multilora_resume"] == 1 and len(tags) == 3
    assert tags[0].split()[1] == tags[2].split()[1] != tags[1].split()[1]  # base, legal, base
    rc, _, err = run_cli(["run", str(inp), *args(model_dir)])
    assert rc == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl", "out.jsonl.resume"]


def test_a_file_where_the_ledger_goes_is_a_usage_error(model_dir, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", NO_IDS), tmp_path / "out.jsonl"
    rc, _, err = run_cli(["run", str(inp), *args(model_dir), "-o", str(out), "--stats", f"{out}.resume"])
    assert rc == 2 and "keeps its --resume ledger" in err and not out.exists(), err


def test_another_input_with_as_many_lines_is_refused(model_dir, tmp_path):
    # the reviewer's case: no ids, so the ids (line numbers) of any 3-line file match
    a, b = write_jsonl(tmp_path / "a.jsonl", NO_IDS), write_jsonl(tmp_path / "b.jsonl", OTHER)
    out = tmp_path / "out.jsonl"
    run_to(model_dir, a, out)
    before = interrupt(out, 2)
    refused(resume(model_dir, b, out), out, before, f"{out} record 1 answers another request than input line 1")


def test_an_edited_prompt_under_the_same_id_is_refused(model_dir, tmp_path):
    rows = [{"id": f"r{i}", **r} for i, r in enumerate(NO_IDS)]
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    run_to(model_dir, inp, out)
    before = interrupt(out, 2)
    rows[1]["prompt"] = "The weather tomorrow is"
    write_jsonl(inp, rows)
    refused(resume(model_dir, inp, out), out, before, "record 2 answers another request than input line 2")


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--max-tokens", "3"], "other settings (max_tokens 16 -> 3)"),
        (["--seed", "5"], "other settings (seed 0 -> 5)"),
        (["--temperature", "0.7"], "temperature 0.0 -> 0.7"),
    ],
)
def test_changed_flags_are_refused(model_dir, tmp_path, extra, words):
    inp, out = write_jsonl(tmp_path / "in.jsonl", NO_IDS), tmp_path / "out.jsonl"
    run_to(model_dir, inp, out)
    before = interrupt(out, 1)
    refused(resume(model_dir, inp, out, *extra), out, before, "record 1 (input line 1) was written under", words)


def interrupted_with_own_legal(model_dir, tmp_path):
    """A run of NO_IDS with its own copy of the legal adapter, left as a kill after 2 records would leave it:
    (legal folder, input, output, the output's bytes)."""
    legal = tmp_path / "legal"
    shutil.copytree(model_dir / "legal", legal)
    inp, out = write_jsonl(tmp_path / "in.jsonl", NO_IDS), tmp_path / "out.jsonl"
    run_to(model_dir, inp, out, legal=legal)
    return legal, inp, out, interrupt(out, 2)


def test_a_changed_adapter_is_refused(model_dir, tmp_path):
    legal, inp, out, before = interrupted_with_own_legal(model_dir, tmp_path)
    cfg = json.loads((legal / "adapter_config.json").read_text())
    cfg["lora_alpha"] *= 2  # retrained / re-scaled under the same name and path
    (legal / "adapter_config.json").write_text(json.dumps(cfg))
    refused(
        resume(model_dir, inp, out, legal=legal),
        out,
        before,
        "record 2 (input line 2) was written by another adapter 'legal'",
    )


@pytest.mark.parametrize("ledger", ["ahead", "even", "torn"])
def test_a_killed_run_resumes_to_the_uninterrupted_output(model_dir, tmp_path, ledger):
    rows = NO_IDS + [
        {
            "prompt": f"The court held that the {i} tenants",
            "adapter": "legal" if i % 2 else None,
            **({"temperature": 1.5} if i % 3 == 0 else {}),
        }
        for i in range(5)
    ]
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    full = run_to(model_dir, inp, out)
    full_ledger = ledger_path(out).read_bytes()
    interrupt(out, 2, ledger)
    rc, _, err = resume(model_dir, inp, out)
    assert rc == 0, err
    assert out.read_bytes() == full and ledger_path(out).read_bytes() == full_ledger
    rc, _, err = resume(model_dir, inp, out)  # a finished output: verified again, nothing to run
    assert rc == 0 and out.read_bytes() == full and ledger_path(out).read_bytes() == full_ledger, err


def test_resume_to_a_missing_output_ignores_a_stale_ledger(model_dir, tmp_path):
    a, b = write_jsonl(tmp_path / "a.jsonl", NO_IDS), write_jsonl(tmp_path / "b.jsonl", OTHER)
    out = tmp_path / "out.jsonl"
    run_to(model_dir, a, out)
    out.unlink()
    rc, _, err = resume(model_dir, b, out)
    assert rc == 0, err
    before = interrupt(out, 1)
    refused(resume(model_dir, a, out), out, before, "record 1 answers another request")  # the new ledger is b's


def test_without_a_ledger_records_numbered_by_line_are_refused(model_dir, tmp_path):
    a, b = write_jsonl(tmp_path / "a.jsonl", NO_IDS), write_jsonl(tmp_path / "b.jsonl", OTHER)
    out = tmp_path / "out.jsonl"
    run_to(model_dir, a, out)
    before = interrupt(out, 2)
    ledger_path(out).unlink()  # an older multilora's output, or `head -2 out > other`
    refused(
        resume(model_dir, b, out),
        out,
        before,
        f"{out} has no ledger {ledger_path(out)} and its record 1 (input line 1) has no id of its own",
    )


def test_without_a_ledger_records_with_ids_are_kept_with_a_warning(model_dir, tmp_path):
    rows = [{"id": f"r{i}", **r} for i, r in enumerate(NO_IDS)]
    inp, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    full = run_to(model_dir, inp, out)
    interrupt(out, 1)
    ledger_path(out).unlink()
    rc, _, err = resume(model_dir, inp, out)
    assert rc == 0 and out.read_bytes() == full, err
    assert "warning:" in err and "checked by id only" in err  # even with -q: the check was weaker
    assert not ledger_path(out).exists()  # one starting at record 2 could not vouch for record 1
