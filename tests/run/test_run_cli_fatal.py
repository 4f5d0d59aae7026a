"""`multilora run` failures that stop the run before any generation: one clear message, the right exit code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.run.helpers import read_jsonl, run_cli, write_jsonl

LINES = [{"id": "a", "prompt": "The court held that"}, {"id": "b", "prompt": "x", "adapter": "legal"}]


@pytest.fixture()
def inp(tmp_path):
    return write_jsonl(tmp_path / "in.jsonl", LINES)


def base_args(model_dir):
    return ["-m", str(model_dir / "base"), "-a", f"legal={model_dir / 'legal'}", "--device", "cpu", "-q"]


@pytest.mark.parametrize("content", [b"", b"\n  \n\r\n"])
def test_empty_input_is_not_an_error(model_dir, tmp_path, content):
    p = tmp_path / "empty.jsonl"
    p.write_bytes(content)
    out, stats = tmp_path / "out.jsonl", tmp_path / "s.json"
    rc, stdout, stderr = run_cli(["run", str(p), *base_args(model_dir), "-o", str(out), "--stats", str(stats)])
    assert rc == 0, stderr
    assert "no requests" in stderr and out.read_bytes() == b""
    s = json.loads(stats.read_text())
    assert s["records"] == 0 and s["requests"] == 0 and s["errors"] == 0


@pytest.mark.parametrize("flag", ["-o", "--errors", "--stats"])
def test_unwritable_outputs_fail_before_generation(model_dir, inp, tmp_path, flag):
    rc, stdout, stderr = run_cli(["run", str(inp), *base_args(model_dir), flag, str(tmp_path / "no" / "x.jsonl")])
    assert rc == 1 and stdout == b""
    assert "cannot write" in stderr and "no/x.jsonl" in stderr and stderr.count("\n") == 1


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("flag", ["--errors", "--stats"])
def test_outputs_where_files_cannot_be_created_fail_before_generation(model_dir, inp, flag):
    # /proc passes os.access() for root, yet no file can be created there: the whole run used to finish and
    # then fail writing --stats (exit 1 after all the work). Now it fails up front.
    rc, stdout, stderr = run_cli(["run", str(inp), *base_args(model_dir), flag, "/proc/multilora-x.json"])
    assert rc == 1 and stdout == b"", stderr
    assert "cannot write" in stderr and "/proc/multilora-x.json" in stderr and stderr.count("\n") == 1


def test_corrupt_base_model_is_a_fatal_model_error(model_dir, inp, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(model_dir / "base", base)
    w = base / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100_000])
    rc, stdout, stderr = run_cli(["run", str(inp), "-m", str(base), "--device", "cpu", "-q"])
    assert rc == 1 and stdout == b"", stderr
    assert "model.safetensors: not a readable safetensors file" in stderr and "internal error" not in stderr
    assert stderr.count("\n") <= 2  # the message and its hint


def test_max_model_len_above_the_models_positions_is_a_usage_error(model_dir, inp):
    rc, stdout, stderr = run_cli(["run", str(inp), *base_args(model_dir), "--max-model-len", "100000"])
    assert rc == 2 and stdout == b"", stderr
    assert "--max-model-len 100000 is above the model's max_position_embeddings" in stderr


def test_a_run_that_cannot_start_leaves_the_last_runs_output_as_it_was(model_dir, inp, tmp_path):
    # -o was opened (truncated) and its ledger rewritten before the engine started: a rerun with a bad flag
    # that only the engine checks (exit 2) emptied a finished output, and --resume had nothing left to keep
    out, ledger = tmp_path / "out.jsonl", tmp_path / "out.jsonl.resume"
    rc, _, stderr = run_cli(["run", str(inp), *base_args(model_dir), "-o", str(out)])
    assert rc == 0, stderr
    before = out.read_bytes(), ledger.read_bytes()
    rc, _, stderr = run_cli(["run", str(inp), *base_args(model_dir), "-o", str(out), "--max-model-len", "100000"])
    assert rc == 2 and "max_position_embeddings" in stderr, stderr
    assert (out.read_bytes(), ledger.read_bytes()) == before


def test_an_adapter_folder_given_as_the_model_says_so(model_dir, inp):
    rc, stdout, stderr = run_cli(["run", str(inp), "-m", str(model_dir / "legal"), "--device", "cpu", "-q"])
    assert rc == 1 and stdout == b"", stderr
    assert "this is a LoRA adapter folder (adapter_config.json), not a base model" in stderr
    assert "pass it with --adapters" in stderr


@pytest.mark.parametrize("flag", ["INPUT", "-o", "--errors", "--stats"])
def test_unknown_user_home_is_a_missing_path_not_an_internal_error(model_dir, inp, flag):
    # Path("~nosuchuser/x").expanduser() raises RuntimeError: every path flag was an internal error (exit 1)
    path = "~nosuchuser-ml/x.jsonl"
    argv = ["run", path if flag == "INPUT" else str(inp), *base_args(model_dir)] + (
        [] if flag == "INPUT" else [flag, path]
    )
    rc, stdout, stderr = run_cli(argv)
    assert rc != 0 and "internal error" not in stderr and "does not exist" in stderr, stderr
    assert path in stderr and stderr.count("\n") == 1


def test_missing_input(model_dir, tmp_path):
    rc, _, stderr = run_cli(["run", str(tmp_path / "none.jsonl"), *base_args(model_dir)])
    assert rc == 1 and "does not exist" in stderr


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--top-p", "2"], "--top-p must be a number in (0, 1], got 2.0"),
        (["--temperature", "-1"], "--temperature must be"),
        (["--max-tokens", "0"], "Invalid value for '--max-tokens'"),  # ranges and choices: Typer's usage error
        (["--max-loras", "0"], "Invalid value for '--max-loras'"),
        (["--dtype", "float8"], "Invalid value for '--dtype'"),
        (["--device", "tpu"], "Invalid value for '--device'"),
        (["--gpu-hour-usd", "-1"], "Invalid value for '--gpu-hour-usd'"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be in [0.05, 0.99], got 1.5"),
        (["--gpu-memory-utilization", "nan"], "--gpu-memory-utilization must be in"),
        (["--temperature", "inf"], "--temperature must be a finite number"),
        (["--resume"], "--resume needs -o"),
        (["--max-tokens", "ten"], "--max-tokens"),
        (["--errors", "-"], "--errors - would mix into the results on stdout"),  # used to duplicate error records
        (["--stats", "-"], "--stats - would mix"),  # used to write a file named "-"
    ],
)
def test_bad_flags_exit_2(model_dir, inp, extra, words):
    rc, stdout, stderr = run_cli(["run", str(inp), *base_args(model_dir), *extra])
    assert rc == 2 and stdout == b"" and words in stderr, stderr


def test_empty_stdin_is_not_an_error(model_dir):
    rc, stdout, stderr = run_cli(["run", "-", *base_args(model_dir)], stdin=b"")
    assert rc == 0 and stdout == b"" and "no requests in <stdin>" in stderr, stderr


def test_output_same_as_input(model_dir, inp):
    rc, _, stderr = run_cli(["run", str(inp), *base_args(model_dir), "-o", str(inp)])
    assert rc == 2 and "same file" in stderr
    assert read_jsonl(inp) == LINES  # not truncated


@pytest.mark.parametrize("flag", ["--errors", "--stats"])
def test_errors_or_stats_same_as_output(model_dir, inp, tmp_path, flag):
    out = tmp_path / "out.jsonl"
    rc, stdout, stderr = run_cli(
        ["run", str(inp), *base_args(model_dir), "-o", str(out), flag, f"{tmp_path}/./out.jsonl"]
    )
    assert rc == 2 and stdout == b"" and stderr.count("\n") == 1, stderr
    assert f"--output and {flag} are the same file" in stderr and not out.exists()


@pytest.mark.parametrize(
    "spec, words",
    [
        ("legal=", "--adapters 'legal=': expected NAME=PATH"),
        ("=", "--adapters '=': expected NAME=PATH"),
        ("legal=/elsewhere", "adapter name 'legal' is given twice"),
    ],
)
def test_bad_adapter_items_are_usage_errors(model_dir, inp, spec, words):
    rc, stdout, stderr = run_cli(["run", str(inp), *base_args(model_dir), "-a", spec])
    assert rc == 2 and stdout == b"" and stderr.count("\n") == 1 and words in stderr, stderr


def test_one_adapter_named_twice_and_a_home_relative_path(model_dir, inp, tmp_path, monkeypatch):
    # `-a legal=P -a legal=P` (a script adding its defaults twice) is one adapter; `~/...` is the user's home.
    home = tmp_path / "home"
    shutil.copytree(model_dir / "legal", home / "loras" / "legal")
    monkeypatch.setenv("HOME", str(home))
    rc, stdout, stderr = run_cli(
        [
            "run",
            str(inp),
            "-m",
            str(model_dir / "base"),
            "--device",
            "cpu",
            "-q",
            "-a",
            "~/loras/legal",
            "-a",
            "legal=~/loras/legal/",
            "-o",
            "~/out.jsonl",
        ]
    )
    assert rc == 0 and stdout == b"", stderr
    assert [r["id"] for r in read_jsonl(home / "out.jsonl")] == ["a", "b"]


def test_no_model_no_adapters(inp):
    rc, _, stderr = run_cli(["run", str(inp)])
    assert rc == 2 and "--model" in stderr


def test_adapters_disagreeing_on_base_without_model(model_dir, inp, tmp_path):
    other = tmp_path / "other_base"
    shutil.copytree(model_dir / "base", other)
    stray = tmp_path / "stray"
    shutil.copytree(model_dir / "legal", stray)
    cfg = json.loads((stray / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(other)
    (stray / "adapter_config.json").write_text(json.dumps(cfg))
    rc, stdout, stderr = run_cli(
        ["run", str(inp), "-a", f"legal={model_dir / 'legal'}", "-a", f"stray={stray}", "--device", "cpu", "-q"]
    )
    assert rc == 2 and stdout == b""
    assert "different base models" in stderr and "--model" in stderr


def test_resume_against_another_inputs_output_is_refused(model_dir, inp, tmp_path):
    out = tmp_path / "out.jsonl"
    foreign = (
        json.dumps(
            {
                "id": "zzz",
                "adapter": None,
                "text": "t",
                "finish_reason": "stop",
                "usage": {"prompt_tokens": 1, "completion_tokens": 1},
            }
        )
        + "\n"
    )
    out.write_text(foreign + '{"id": "torn')
    rc, stdout, stderr = run_cli(["run", str(inp), *base_args(model_dir), "-o", str(out), "--resume"])
    assert rc == 1 and stdout == b""
    assert 'record 1 has id "zzz" but input line 1 has id "a"' in stderr and "different input" in stderr
    assert out.read_text() == foreign + '{"id": "torn'  # untouched, torn tail included


def test_resume_with_everything_done_keeps_the_output(model_dir, inp, tmp_path):
    out, errors = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    done = [
        {
            "id": "a",
            "adapter": None,
            "text": "t",
            "finish_reason": "stop",
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        },
        {"id": "b", "adapter": "legal", "error": {"code": "x", "message": "m"}},
    ]
    write_jsonl(out, done)
    rc, stdout, stderr = run_cli(
        ["run", str(inp), *base_args(model_dir), "-o", str(out), "--resume", "--errors", str(errors)]
    )
    assert rc == 3, stderr  # the kept output holds an error record
    assert read_jsonl(out) == done and read_jsonl(errors) == [done[1]]
