"""examples/eval/rank.py end to end on the tiny model: questions -> scoring lines -> `multilora run` -> accuracy
table with one row per adapter (each question answered from its four choices' logprobs)."""

from __future__ import annotations

import subprocess
import sys

from tests.run.helpers import REPO, read_jsonl, run_cli

RANK = REPO / "examples" / "eval" / "rank.py"
QUESTIONS = REPO / "examples" / "eval" / "questions.jsonl"


def test_rank_adapters_from_one_run(model_dir, tmp_path):
    lines = subprocess.run(
        [sys.executable, str(RANK), "lines", str(QUESTIONS), "legal", "base"], capture_output=True, check=True
    ).stdout
    (tmp_path / "eval.jsonl").write_bytes(lines)
    out = tmp_path / "scores.jsonl"
    args = ["run", str(tmp_path / "eval.jsonl"), "-m", str(model_dir / "base"), "-a", f"legal={model_dir / 'legal'}"]
    rc, _, err = run_cli([*args, "--device", "cpu", "-q", "-o", str(out)])
    assert rc == 0, err
    recs = read_jsonl(out)
    assert len(recs) == 2 * 18 * 4 and all("is_greedy" in r for r in recs)
    table = subprocess.run(
        [sys.executable, str(RANK), "score", str(QUESTIONS), str(out)], capture_output=True, check=True, text=True
    ).stdout.splitlines()
    assert table[0].split() == ["adapter", "acc", "acc_norm", "code", "legal", "medical"]
    assert sorted(row.split()[0] for row in table[1:]) == ["base", "legal"]
    assert all(0 <= float(x) <= 1 for row in table[1:] for x in row.split()[1:])
