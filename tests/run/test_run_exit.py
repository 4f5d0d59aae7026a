"""A real `multilora run` process ends without the interpreter's module teardown (cli._end_process: threads
joined and atexit hooks run, then os._exit), and nothing it wrote is lost: every record on stdout (a pipe), the
error records and the stats in their files, and a -o file's --resume ledger, which a second run reads back."""

from __future__ import annotations

import json
import subprocess

from tests.run.helpers import multilora_cmd, subprocess_env, write_jsonl

ROWS = [{"id": f"r{i}", "prompt": f"The court held that {i}", "max_tokens": 4} for i in range(6)]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([*multilora_cmd(), *args], capture_output=True, env=subprocess_env(), timeout=300)


def test_a_run_process_loses_no_output_at_exit(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [*ROWS, {"id": "bad", "prompt": 7}])
    common = ["run", str(inp), "-m", str(model_dir / "base"), "--device", "cpu", "-q"]
    res = _run([*common, "--errors", str(tmp_path / "errors.jsonl"), "--stats", str(tmp_path / "stats.json")])
    assert res.returncode == 3, res.stderr.decode()  # an error record: exit 3
    records = [json.loads(x) for x in res.stdout.decode().splitlines()]
    assert [r["id"] for r in records] == [r["id"] for r in ROWS] + ["bad"]
    assert all(r.get("text") for r in records[:-1]) and "error" in records[-1]
    errors = [json.loads(x) for x in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert [e["id"] for e in errors] == ["bad"]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert (stats["requests"], stats["ok"], stats["errors"]) == (7, 6, 1)
    assert not res.stderr, res.stderr.decode()  # -q: nothing, not even shutdown noise

    out = tmp_path / "out.jsonl"
    assert _run([*common, "-o", str(out)]).returncode == 3
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == [r["id"] for r in records]
    again = _run([*common[:-1], "-o", str(out), "--resume"])  # the ledger was written whole: nothing left to run
    assert again.returncode == 3 and "nothing left to run" in again.stderr.decode(), again.stderr.decode()
    assert out.read_text().count("\n") == 7
