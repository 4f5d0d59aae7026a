"""--errors and --stats aimed where a shell user aims them: /dev/stderr (/dev/fd/2), a FIFO another process reads,
a symlink to a file elsewhere. Each gets the records / the JSON, and stays what it was (no file is created or
renamed beside it: the stats file used to be written as a temp file renamed over the path, which replaced a
FIFO or a symlink, and as root even /dev/stderr, with a regular file).
"""

from __future__ import annotations

import json
import os
import threading

from tests.run.helpers import read_jsonl, run_sub, write_jsonl

ROWS = [{"id": "a", "prompt": "The court held that", "max_tokens": 2}, {"id": "b", "prompt": "x", "adapter": "nope"}]


def model_args(model_dir) -> list[str]:
    return ["-m", str(model_dir / "base"), "-a", f"legal={model_dir / 'legal'}", "--device", "cpu", "-q"]


def test_errors_and_stats_to_dev_fd_2_land_on_stderr(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    res = run_sub(["run", str(inp), *model_args(model_dir), "--errors", "/dev/fd/2"], timeout=120)
    err = res.stderr.decode()
    assert res.returncode == 3, err  # was exit 1: "cannot create a file in /dev/fd"
    assert [r["id"] for r in read_jsonl(res.stdout)] == ["a", "b"]
    assert [json.loads(x)["id"] for x in err.splitlines() if x.startswith("{")] == ["b"]
    res = run_sub(["run", str(inp), *model_args(model_dir), "--stats", "/dev/fd/2"], timeout=120)
    err = res.stderr.decode()
    assert res.returncode == 3, err
    assert json.loads(err[err.index("{") :])["records"] == 2


def test_stats_through_a_symlink_writes_its_target_and_keeps_the_link(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    (tmp_path / "real").mkdir()
    link = tmp_path / "stats.json"
    link.symlink_to(tmp_path / "real" / "stats.json")
    res = run_sub(["run", str(inp), *model_args(model_dir), "--stats", str(link)], timeout=120)
    assert res.returncode == 3, res.stderr.decode()
    assert link.is_symlink()
    assert json.loads((tmp_path / "real" / "stats.json").read_text())["records"] == 2


def test_stats_to_a_fifo_reaches_its_reader_and_keeps_the_fifo(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    fifo = tmp_path / "stats.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    res = run_sub(["run", str(inp), *model_args(model_dir), "--stats", str(fifo)], timeout=120)
    if reader.is_alive():  # the run never opened the FIFO: let the reader go
        with open(fifo, "wb"):
            pass
    reader.join(10)
    assert res.returncode == 3, res.stderr.decode()
    assert fifo.is_fifo()
    assert json.loads(got[0])["records"] == 2
