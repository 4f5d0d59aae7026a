"""`multilora run` as a real process: a shell pipeline through stdin/stdout, the progress bar on a terminal that
never leaks into stdout, and kill -9 midway followed by --resume (every id exactly once, same greedy text).
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import threading

from multilora_cli.run.signal_after import TEST_SIGNAL_ENV
from tests.run.helpers import multilora_cmd, read_jsonl, run_cli, subprocess_env, write_jsonl

ADAPTER_CYCLE = ["legal", "medical", None, "code"]


def rows(n: int, max_tokens: int = 8, sample_every: int = 0) -> list[dict]:
    """n requests cycling over the adapters and the base; every `sample_every`-th samples (no seed of its own)."""
    return [
        {
            "id": f"r{i}",
            "prompt": f"The court held that the {i} tenants",
            "max_tokens": max_tokens,
            **({"adapter": ADAPTER_CYCLE[i % 4]} if ADAPTER_CYCLE[i % 4] else {}),
            **({"temperature": 1.5} if sample_every and i % sample_every == 0 else {}),
        }
        for i in range(n)
    ]


def model_args(model_dir) -> list[str]:
    return ["-m", str(model_dir / "base"), "--adapter-dir", str(model_dir), "--device", "cpu"]


def test_stdin_to_stdout_shell_pipeline(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", rows(12, 4) + ["", '{"id": "bad", "adapter": "nobody", "prompt": "x"}'])
    consumer = (
        "import sys, json; rs = [json.loads(l) for l in sys.stdin]; "
        "print(len(rs), ','.join(str(r['id']) for r in rs), sum('error' in r for r in rs))"
    )
    mult = " ".join(multilora_cmd() + ["run", "-"] + model_args(model_dir))
    script = (
        f'cat {inp} | {mult} 2>{tmp_path / "err.txt"} | {sys.executable} -c "{consumer}"; echo rc=${{PIPESTATUS[1]}}'
    )
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=subprocess_env(), timeout=300)
    count, ids, errors, rc = res.stdout.split()
    assert (count, errors, rc) == ("13", "1", "rc=3"), res.stdout + (tmp_path / "err.txt").read_text()
    assert ids.split(",") == [f"r{i}" for i in range(12)] + ["bad"]
    assert "multilora run" in (tmp_path / "err.txt").read_text()  # the summary went to stderr, not the pipe


def test_progress_on_a_terminal_never_touches_stdout(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", rows(16, 6))
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        multilora_cmd() + ["run", str(inp), *model_args(model_dir)],
        stdout=subprocess.PIPE,
        stderr=slave,
        env=subprocess_env(),
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    stdout, _ = proc.communicate(timeout=300)
    t.join(timeout=10)
    os.close(master)
    assert proc.returncode == 0
    recs = read_jsonl(stdout)  # every stdout line is a JSON record: no bar, no table, no escape codes
    assert [r["id"] for r in recs] == [f"r{i}" for i in range(16)]
    assert b"\x1b" not in stdout
    term = b"".join(chunks).decode(errors="replace")
    assert "16/16" in term and "tok/s" in term  # the rich bar: done/total and throughput
    assert "per adapter" in term  # and the summary table


def test_kill_9_midway_then_resume_gives_every_id_once_with_the_same_text(model_dir, tmp_path):
    n = 48
    data = rows(n, 6, sample_every=3)  # sampled lines too: their seeds derive from the line, not the process
    inp = write_jsonl(tmp_path / "in.jsonl", data)
    flags = ["--max-num-seqs", "2", "-q"]  # few sequences per step: records come a few at a time

    rc, ref_out, err = run_cli(["run", str(inp), *model_args(model_dir), *flags])
    assert rc == 0, err
    ref = read_jsonl(ref_out)

    out = tmp_path / "out.jsonl"
    killed = _run_until_signal(["run", str(inp), *model_args(model_dir), *flags, "-o", str(out)], "SIGKILL:5")
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    prefix = out.read_bytes()
    done = prefix.count(b"\n")
    assert 5 <= done < n, f"killed after {done} of {n} records"  # the write that reached 5 may have added more
    kept = read_jsonl(prefix[: prefix.rfind(b"\n") + 1])
    assert [r["id"] for r in kept] == [f"r{i}" for i in range(len(kept))]  # a valid, in-order prefix
    with open(out, "ab") as f:  # and a torn last line, as a kill during a write would leave
        f.write(b'{"id": "r' + str(done).encode() + b'", "adap')

    res = subprocess.run(
        multilora_cmd() + ["run", str(inp), *model_args(model_dir), "--max-num-seqs", "2", "-o", str(out), "--resume"],
        capture_output=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr.decode()
    assert f"{done} records kept" in res.stderr.decode() and "torn" in res.stderr.decode()
    final = read_jsonl(out)
    assert [r["id"] for r in final] == [f"r{i}" for i in range(n)]  # every id exactly once, in order
    assert final == ref  # the same text (and usage) as the uninterrupted run, sampled lines included


def _run_until_signal(args: list[str], signal_after: str) -> subprocess.CompletedProcess:
    """Run `multilora ARGS` that signals itself as `signal_after` ("SIGNAL:N", run/signal_after.py) says: right
    after the write that brings its output to N or more records, never racing the run."""
    env = {**subprocess_env(), TEST_SIGNAL_ENV: signal_after}
    return subprocess.run(multilora_cmd() + args, capture_output=True, env=env, timeout=300)


def test_sigterm_midway_stops_with_143_a_valid_prefix_and_the_resume_hint(model_dir, tmp_path):
    # `kill PID` (and Slurm / Kubernetes cancelling a job) used to end the run without a word.
    inp = write_jsonl(tmp_path / "in.jsonl", rows(48, 6))
    out = tmp_path / "out.jsonl"
    res = _run_until_signal(
        ["run", str(inp), *model_args(model_dir), "--max-num-seqs", "2", "-q", "-o", str(out)], "SIGTERM:3"
    )
    err = res.stderr.decode()
    assert res.returncode == 143, err
    assert res.stdout == b"" and "Traceback" not in err
    assert err.strip().splitlines()[-1] == "error: terminated (SIGTERM)"
    assert "rerun the same command with --resume" in err
    recs = read_jsonl(out)
    assert 3 <= len(recs) < 48 and [r["id"] for r in recs] == [f"r{i}" for i in range(len(recs))]
    assert out.read_bytes().endswith(b"\n")  # whole lines only
