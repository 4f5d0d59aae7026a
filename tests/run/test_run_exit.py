"""A real `multilora run` process ends without the interpreter's last garbage collections (cli.main leaves the
live objects to the OS: gc.freeze after one collection), and nothing it wrote is lost: every record on stdout (a
pipe, flushed at exit), the error records and the stats in their files, whole."""

from __future__ import annotations

import json
import subprocess

from tests.run.helpers import multilora_cmd, subprocess_env, write_jsonl

ROWS = [{"id": f"r{i}", "prompt": f"The court held that {i}", "max_tokens": 4} for i in range(6)]


def test_a_run_process_loses_no_output_at_exit(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [*ROWS, {"id": "bad", "prompt": 7}])
    cmd = [*multilora_cmd(), "run", str(inp), "-m", str(model_dir / "base"), "--device", "cpu", "-q"]
    cmd += ["--errors", str(tmp_path / "errors.jsonl"), "--stats", str(tmp_path / "stats.json")]
    res = subprocess.run(cmd, capture_output=True, env=subprocess_env(), timeout=300)
    assert res.returncode == 3, res.stderr.decode()  # an error record: exit 3
    records = [json.loads(x) for x in res.stdout.decode().splitlines()]
    assert [r["id"] for r in records] == [r["id"] for r in ROWS] + ["bad"]
    assert all(r.get("text") for r in records[:-1]) and "error" in records[-1]
    errors = [json.loads(x) for x in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert [e["id"] for e in errors] == ["bad"]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert (stats["requests"], stats["ok"], stats["errors"]) == (7, 6, 1)
    assert b"Traceback" not in res.stderr and b"Exception ignored" not in res.stderr
