"""`multilora run` with the prefix cache (default) and `--no-prefix-cache`: the same records in input order, the
stats' "prefix_cache" section, its summary line, and (data parallel) the workers' counts merged."""

from __future__ import annotations

import json

from tests.run.helpers import read_jsonl, run_cli, write_jsonl

SYSTEM = "You are a careful assistant. Answer briefly and cite the court that held the matter. " * 3


def rows() -> list[dict]:
    """24 lines over three adapters and the base: half share a long system prompt, some repeat exactly."""
    out = []
    for i in range(24):
        q = f"question {i % 9}: what did the court hold?"
        prompt = SYSTEM + q if i % 2 == 0 else q
        out.append({"id": f"r{i}", "prompt": prompt, "adapter": ["legal", "medical", None, "code"][i % 4]})
        out[-1]["max_tokens"] = 3 + i % 4
        if i % 3 == 0:
            out[-1].update(temperature=0.8, seed=i)
    return out


def args(model_dir, tmp_path, name: str, *extra) -> list[str]:
    return [
        *("-m", str(model_dir / "base"), "--adapter-dir", str(model_dir), "--device", "cpu"),
        *("--max-loras", "2", "--stats", str(tmp_path / f"{name}.json"), *extra),
    ]


def test_cache_on_and_off_write_the_same_records(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", rows())
    rc1, on, err_on = run_cli(["run", str(inp), *args(model_dir, tmp_path, "on")])
    rc2, off, _ = run_cli(["run", str(inp), *args(model_dir, tmp_path, "off", "--no-prefix-cache", "-q")])
    assert rc1 == rc2 == 0
    r_on, r_off = read_jsonl(on), read_jsonl(off)
    assert [r["id"] for r in r_on] == [r["id"] for r in rows()]  # input order, whatever order they ran in
    assert r_on == r_off
    s_on = json.loads((tmp_path / "on.json").read_text())
    s_off = json.loads((tmp_path / "off.json").read_text())
    pc = s_on["prefix_cache"]
    assert pc["prompt_tokens"] == s_on["prompt_tokens"] == s_off["prefix_cache"]["prompt_tokens"]
    assert pc["hit_tokens"] > 0 and pc["hit_rate"] == pc["hit_tokens"] / pc["prompt_tokens"]
    assert s_off["prefix_cache"]["hit_tokens"] == 0
    assert s_on["engine"]["prefix_cache"] == pc
    assert "prefix cache" in err_on and f"{pc['hit_tokens']:,} of {pc['prompt_tokens']:,}" in err_on


def test_data_parallel_stats_merge_the_prefix_cache(model_dir, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", rows())
    rc, out, err = run_cli(["run", str(inp), *args(model_dir, tmp_path, "dp", "--data-parallel", "2", "-q")])
    assert rc == 0, err
    s = json.loads((tmp_path / "dp.json").read_text())
    workers = s["engine"]["data_parallel"]["workers"]
    assert len(workers) == 2
    pc = s["prefix_cache"]
    assert pc["prompt_tokens"] == s["prompt_tokens"] and pc["hit_tokens"] > 0
    assert s["engine"]["prefix_prompt_tokens"] == pc["prompt_tokens"]
