"""`n` over data parallelism: results with several samples travel from the workers (distributed/protocol.py) and
a `--data-parallel 2` run with n=2 lines writes exactly what one worker writes, its stats summing every sample."""

from __future__ import annotations

import json
import subprocess
import sys

from multilora_cli.distributed.protocol import pack_result, unpack_result
from multilora_cli.engine.request import Result, Sample
from multilora_cli.errors import RequestError
from tests.run.helpers import build_model_dir, run_cli, subprocess_env, write_jsonl


def test_results_with_samples_survive_the_trip():
    samples = [Sample(0, "a", [5, 6], "stop", 3), Sample(1, "b", [7], "length", 1)]
    two = Result(1, "x", "legal", "a", [5, 6], "stop", 4, 4, samples=samples)
    assert unpack_result(pack_result(two)) == two
    one = Result(2, "y", None, "c", [8], "length", 2, 1, samples=[Sample(0, "c", [8], "length", 1)])
    assert unpack_result(pack_result(one)) == one
    failed = unpack_result(pack_result(Result(3, "z", None, error=RequestError("bad", code="prompt_too_long"))))
    assert failed.error.code == "prompt_too_long" and failed.samples == []


def rows() -> list[dict]:
    out = []
    for i in range(12):
        r: dict = {"id": f"r{i}", "prompt": f"The court held that the {i} tenants", "max_tokens": 3 + i % 4}
        if i % 3:
            r["adapter"] = ["legal", "medical"][i % 2]
        if i % 2:
            r["n"] = 2
            r["temperature"] = 1.5  # sampled, seeds derived from (run seed, line): not from the worker
        out.append(r)
    return out


def test_two_workers_with_n2_write_what_one_worker_writes(tmp_path):
    model = build_model_dir(tmp_path / "model")
    inp = write_jsonl(tmp_path / "in.jsonl", rows())
    flags = ["-m", str(model / "base"), "--adapter-dir", str(model), "--device", "cpu", "--seed", "7"]
    rc, ref, err = run_cli(["run", str(inp), *flags, "-q"])
    assert rc == 0, err
    out, stats = tmp_path / "out.jsonl", tmp_path / "stats.json"
    res = subprocess.run(
        [sys.executable, "-m", "multilora_cli", "run", str(inp), *flags, "--data-parallel", "2"]
        + ["-o", str(out), "--stats", str(stats), "-q"],
        capture_output=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    assert out.read_bytes() == ref
    recs = [json.loads(x) for x in ref.splitlines()]
    assert [len(r.get("choices", [r])) for r in recs] == [1, 2] * 6
    s = json.loads(stats.read_text())
    assert s["ok"] == 12 and s["completion_tokens"] == sum(r["usage"]["completion_tokens"] for r in recs)
    assert all(w["requests"] > 0 for w in s["data_parallel"]["workers"])
