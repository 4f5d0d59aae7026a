"""benchmarks/import_split.py: a `python -X importtime` stderr split into torch / triton / the rest, exclusively
(each module under the first import that loaded it), as profile_cold_start reports each run's imports."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.import_split import split
from tests.run.helpers import subprocess_env, write_jsonl

# children print before their parent, two spaces of indent per level; times in microseconds
TRACE = """import time: self [us] | cumulative | imported package
import time:    100000 |     100000 |   encodings
import time:    300000 |     300000 |         numpy
import time:   2000000 |    2300000 |       torch._C
import time:   1000000 |    3300000 |     torch
import time:     50000 |      50000 |       triton.language
import time:    200000 |     250000 |     triton
import time:     40000 |    3590000 |   multilora_cli.engine.logprobs
import time:     10000 |      10000 |   multilora_cli.engine.batch
not an importtime line (a warning on stderr)
import time:      5000 |    3605000 | multilora_cli.run.job
import time:     20000 |      20000 | typer
"""


def test_split_attributes_each_subtree_to_torch_triton_or_the_rest():
    got = split(TRACE, top=2)
    assert got["torch_s"] == 3.3  # torch with its numpy and torch._C
    assert got["triton_s"] == 0.25
    assert got["rest_s"] == 0.175  # encodings 0.1 + logprobs 0.04 + batch 0.01 + job 0.005 + typer 0.02
    assert got["total_s"] == 3.725 and got["modules"] == 10
    # first-level imports of the rest, less the torch / triton inside them (job: itself, encodings, logprobs, batch)
    assert got["top_rest"] == [["multilora_cli.run.job", 0.155], ["typer", 0.02]]
    assert got["top_torch"] == [["torch._C", 2.3], ["torch", 1.0]]  # torch's children, then its own body
    assert split("no importtime here") == {}


def test_a_real_run_split_adds_up(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "adapter": "legal", "prompt": "the court", "max_tokens": 2}])
    args = ["run", str(inp), "-m", str(model_dir / "base"), "-a", f"legal={model_dir / 'legal'}", "--device", "cpu"]
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "multilora_cli", *args, "-q", "-o", str(tmp_path / "o.jsonl")],
        capture_output=True,
        text=True,
        env=subprocess_env(),
    )
    assert p.returncode == 0, p.stderr[-2000:]
    got = split(p.stderr)
    assert got["torch_s"] > 0 and got["triton_s"] > 0 and got["rest_s"] > 0  # the CPU run path imports triton too
    assert abs(got["total_s"] - (got["torch_s"] + got["triton_s"] + got["rest_s"])) <= 0.002  # (rounding)
    assert got["modules"] > 500
    assert not any(name.split(".")[0] in ("torch", "triton") for name, _ in got["top_rest"])
