"""benchmarks/bench_records.py on a small workload: every shape and k runs, both arms' lines agree (the tool exits
otherwise), and the report holds a row per case and the step-loop A/B."""

from __future__ import annotations

import json

from benchmarks.bench_records import main


def test_bench_records_small(tmp_path, capsys):
    out = tmp_path / "records.json"
    argv = ["--tokens", "6", "--lines", "2", "--repeats", "1", "--vocab", "300", "--k", "0,3", "--out", str(out)]
    argv += ["--loop-ab", "--step-python-us", "50", "--step-wait-us", "50"]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert [(r["shape"], r["k"]) for r in report["rows"]] == [
        (s, k) for s in ("simple", "legacy", "chat") for k in (0, 3)
    ]
    assert all(r["before_us_per_token"] > 0 and r["now_us_per_token"] > 0 for r in report["rows"])
    assert set(report["loop_ab"]) == {"none_us_per_step", "inline_us_per_step", "thread_us_per_step"}
    assert "speedup" in capsys.readouterr().out
