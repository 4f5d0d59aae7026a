"""Edges of -o / --resume and of adapter names found by trying to break them: an -o that names a descriptor
(/dev/stdout, /dev/fd/1) has no folder for a ledger; a base model whose folder is named like an adapter must not
answer that adapter's lines; a kept record refused for its adapter says what changed in this run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.run.helpers import multilora_cmd, read_jsonl, run_cli, subprocess_env, write_jsonl
from tests.run.test_run_resume import NO_IDS, args, interrupt, interrupted_with_own_legal, refused, resume, run_to

ROWS = [{"id": "a", "prompt": "The court held that", "adapter": "legal"}, {"id": "b", "prompt": "The court held that"}]


def test_output_to_a_descriptor_runs_without_a_ledger(model_dir, tmp_path):
    # `-o /dev/fd/1 > FILE`: stdout is a regular file, but its ledger would be /dev/fd/1.resume (no such folder:
    # the run failed, exit 1) and for /dev/stdout a file in /dev (created as root, permission denied otherwise)
    inp = write_jsonl(tmp_path / "in.jsonl", NO_IDS)
    stray = Path("/dev/stdout.resume")
    had_stray = stray.exists()
    for dev in ("/dev/fd/1", "/dev/stdout"):
        dest = tmp_path / "captured.jsonl"
        with open(dest, "wb") as f:
            res = subprocess.run(
                [*multilora_cmd(), "run", str(inp), *args(model_dir), "-o", dev],
                stdout=f,
                stderr=subprocess.PIPE,
                env=subprocess_env(),
            )
        assert res.returncode == 0, res.stderr.decode()
        assert len(read_jsonl(dest)) == 3
    assert had_stray or not stray.exists()


def test_resume_to_a_descriptor_is_a_usage_error(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", NO_IDS)
    rc, stdout, err = run_cli(["run", str(inp), *args(model_dir), "-o", "/dev/stdout", "--resume"])
    assert rc == 2 and stdout == b"" and err.count("\n") == 1, err
    assert err.startswith("error: --resume needs -o FILE: /dev/stdout is an open descriptor"), err


def test_a_base_folder_named_like_an_adapter_does_not_answer_its_lines(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    rc, normal, err = run_cli(["run", str(inp), *args(model_dir)])
    assert rc == 0, err
    legal, base = read_jsonl(normal)
    assert legal["text"] != base["text"]  # else the test could not tell who answered
    shutil.copytree(model_dir / "base", tmp_path / "legal")  # a base model kept in a folder named legal
    rc, out, err = run_cli(["run", str(inp), *args(model_dir)[2:], "-m", str(tmp_path / "legal")])
    assert rc == 0, err
    assert out == normal  # line a by adapter legal, as before; the base still answers line b


def test_a_kept_record_of_a_dropped_adapter_says_so(model_dir, tmp_path):
    inp, out = write_jsonl(tmp_path / "in.jsonl", NO_IDS), tmp_path / "out.jsonl"
    run_to(model_dir, inp, out)
    before = interrupt(out, 2)
    no_legal = ["-m", str(model_dir / "base"), "-a", f"code={model_dir / 'code'}", "--device", "cpu", "-q"]
    res = run_cli(["run", str(inp), *no_legal, "-o", str(out), "--resume"])
    refused(
        res,
        out,
        before,
        "record 2 (input line 2) was written by another adapter 'legal': this run has no "
        "adapter of that name (was it dropped from --adapters / --adapter-dir?)",
    )


def test_a_kept_record_of_an_adapter_that_now_fails_pre_flight_says_so(model_dir, tmp_path):
    legal, inp, out, before = interrupted_with_own_legal(model_dir, tmp_path)
    (legal / "adapter_model.safetensors").unlink()
    rc, stdout, err = resume(model_dir, inp, out, legal=legal)
    assert rc == 1 and out.read_bytes() == before, err
    assert err.splitlines()[-1].startswith("error: --resume: ") and "in this run it fails pre-flight" in err, err
