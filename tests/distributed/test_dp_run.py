"""`multilora run --data-parallel 2` and torchrun on CPU (gloo): the same bytes as one worker, stdin included;
merged stats; a worker killed midway fails the run (exit 1, named) and leaves a prefix --resume completes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from multilora_cli.distributed.protocol import TEST_EXIT_ENV
from tests.run.helpers import build_model_dir, run_cli, subprocess_env, write_jsonl

CYCLE = ["legal", "legal", "medical", None, "code", "legal", "base"]  # skewed: legal is hot


def rows(n: int = 28) -> list:
    out: list = []
    for i in range(n):
        a = CYCLE[i % len(CYCLE)]
        r: dict = {"id": f"r{i}", "max_tokens": 3 + i % 5, **({"adapter": a} if a else {})}
        if i % 6 == 5:
            r["messages"] = [{"role": "user", "content": f"How do I run test {i}?"}]
        else:
            r["prompt"] = f"The court held that the {i} tenants"
        if i % 4 == 1:
            r["temperature"] = 1.5  # sampled: its seed derives from (run seed, line), not from the worker
        out.append(r)
    return out + ['{"id": "bad", "adapter": "nobody", "prompt": "x"}']  # last, so dropping it keeps the keys


def args(model: Path, *extra: str) -> list[str]:
    return ["-m", str(model / "base"), "--adapter-dir", str(model), "--device", "cpu", "--seed", "7", *extra]


def sub(argv: list[str], env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "multilora_cli", *argv],
        capture_output=True,
        env={**subprocess_env(), **(env or {})},
        timeout=300,
        **kw,
    )


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """The tiny model + legal/medical/code adapters of the run tests, the input, and one worker's output for it
    (in-process, the ordinary path). No conftest here: a second `conftest` module would shadow others."""
    dp_model = build_model_dir(tmp_path_factory.mktemp("dpmodel"))
    d = tmp_path_factory.mktemp("dp")
    inp = write_jsonl(d / "in.jsonl", rows())
    rc, out, err = run_cli(["run", str(inp), *args(dp_model, "-q")])
    assert rc == 3, err  # the bad line
    return dp_model, inp, out


def test_two_workers_write_what_one_worker_writes_and_merge_stats(case, tmp_path):
    model, inp, ref = case
    out, stats = tmp_path / "out.jsonl", tmp_path / "stats.json"
    res = sub(["run", str(inp), *args(model, "--data-parallel", "2", "-o", str(out), "--stats", str(stats))])
    assert res.returncode == 3, res.stderr.decode()
    assert out.read_bytes() == ref
    s = json.loads(stats.read_text())
    dp = s["data_parallel"]
    assert dp["world_size"] == 2 and dp["launcher"] == "spawn" and dp["sharding"] == "affinity"
    w = dp["workers"]
    assert [x["rank"] for x in w] == [0, 1] and all(x["requests"] > 0 for x in w)
    assert sum(x["requests"] for x in w) == s["ok"] == len(rows()) - 1
    assert sum(x["prompt_tokens"] + x["completion_tokens"] for x in w) == s["total_tokens"]
    assert sum(x["slot_loads"] for x in w) == s["slot_loads"] == s["engine"]["slot_loads"]
    # affinity: 3 adapters over 2 workers, none split -> every adapter loaded on exactly one worker
    assert dp["adapters_split"] == 0 and sum(x["assigned_adapters"] for x in w) == 3
    assert {n: a["slot_loads"] for n, a in s["per_adapter"].items() if n in ("legal", "medical", "code")} == {
        "legal": 1,
        "medical": 1,
        "code": 1,
    }
    assert s["engine"]["device"] == "2 x cpu" and s["tokens_per_second"] > 0
    assert all(x["tokens_per_second"] > 0 for x in w)
    err = res.stderr.decode()
    assert "data parallel: 2 workers" in err and "slot loads" in err  # the per-worker summary table


def test_stdin_to_stdout_with_two_workers(case):
    model, inp, ref = case
    res = sub(["run", "-", *args(model, "--data-parallel", "2", "-q")], input=inp.read_bytes())
    assert res.returncode == 3, res.stderr.decode()
    assert res.stdout == ref


def test_killed_worker_fails_the_run_and_resume_completes_it(case, tmp_path):
    model, inp, ref = case
    out = tmp_path / "out.jsonl"
    flags = args(model, "--data-parallel", "2", "-o", str(out), "-q")
    res = sub(["run", str(inp), *flags], env={TEST_EXIT_ENV: "1:2"})  # worker 1 os._exit(17)s after 2 results
    err = res.stderr.decode()
    assert res.returncode == 1, err
    assert "error: worker 1 (cpu" in err and "died (exit code 17) after returning 2 results" in err
    assert "rerun the same command with --resume" in err
    prefix = out.read_bytes()
    n = ref.count(b"\n")
    assert prefix.count(b"\n") < n and ref.startswith(prefix)  # a valid prefix of the full output

    res = sub(["run", str(inp), *flags, "--resume"])
    assert res.returncode == 3, res.stderr.decode()
    assert out.read_bytes() == ref  # every record once, in order, the same text (sampled lines too)

    res = sub(["run", str(inp), *args(model, "--data-parallel", "2", "-o", str(out)), "--resume"])
    assert res.returncode == 3 and "nothing left to run" in res.stderr.decode(), res.stderr.decode()
    assert out.read_bytes() == ref


def test_torchrun_two_processes(case, tmp_path):
    model, inp, ref = case
    clean = write_jsonl(tmp_path / "clean.jsonl", rows()[:-1])
    out = tmp_path / "out.jsonl"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "multilora_cli",
            "run",
            str(clean),
            *args(model, "-o", str(out), "-q"),
        ],
        capture_output=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    assert out.read_bytes() == ref[: ref.rstrip(b"\n").rfind(b"\n") + 1]  # all but the bad line's record


def test_flag_errors(case, monkeypatch):
    model, inp, _ = case
    rc, _, err = run_cli(["run", str(inp), *args(model, "--data-parallel", "0")])
    assert rc == 2 and "Invalid value for '--data-parallel'" in err
    monkeypatch.setitem(os.environ, "RANK", "0")
    monkeypatch.setitem(os.environ, "WORLD_SIZE", "2")
    rc, _, err = run_cli(["run", str(inp), *args(model, "--data-parallel", "3")])
    assert rc == 2 and "disagrees with torchrun's WORLD_SIZE=2" in err
