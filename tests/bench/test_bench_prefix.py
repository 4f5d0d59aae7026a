"""The prefix-cache benchmark on CPU (tiny preset): the shared-prefix workload's prompts, and `benchmarks.bench_e2e
--prefix-ab` running each row with the cache on and off (same tokens, fewer prompt tokens fed). Numbers mean
nothing here."""

from __future__ import annotations

import json
from dataclasses import replace

from multilora_cli.bench.workload import Workload

W = Workload(preset="tiny", num_adapters=4, num_requests=16, prompt_len=5, output_len=3, shared_prefix_len=24)
W = replace(W, distribution="round")


def test_shared_prefix_workload_prompts():
    reqs = W.requests(512)
    assert [r.adapter for r in reqs] == [f"lora{i % 4}" for i in range(16)]
    assert all(len(r.prompt_token_ids) == 29 == W.total_prompt_len for r in reqs)
    heads = {r.adapter: r.prompt_token_ids[:24] for r in reqs}
    assert all(r.prompt_token_ids[:24] == heads[r.adapter] for r in reqs)  # shared within an adapter's group
    assert len({tuple(h) for h in heads.values()}) == 4  # and only there
    assert len({tuple(r.prompt_token_ids[24:]) for r in reqs}) == 16
    assert replace(W, shared_prefix_len=0).requests(512)[0].prompt_token_ids == reqs[0].prompt_token_ids[24:]


def test_bench_e2e_prefix_ab_smoke(tmp_path, capsys):
    """The issue's workload scaled down: 4 adapters x 4 requests sharing 32 tokens + 4 own, 3 out; then the same
    rows without shared prefixes."""
    from benchmarks.bench_e2e import main

    out = tmp_path / "e2e.json"
    argv = ["--preset", "tiny", "--device", "cpu", "--rows", "4", "--requests", "16", "--distribution", "round"]
    argv += ["--prompt-len", "4", "--output-len", "3", "--max-num-seqs", "8", "--prefix-ab"]
    assert main([*argv, "--shared-prefix", "32", "--out", str(out)], log=lambda m: None) == 0
    report = json.loads(out.read_text())
    on, off = report["rows"]
    assert (on["workload"]["prefix_cache"], off["workload"]["prefix_cache"]) == (True, False)
    assert on["output_tokens"] == off["output_tokens"] == 16 * 3
    (pair,) = report["prefix_cache_ab"]
    assert pair["target"] == 3.0 and pair["ratio"] > 0
    # each group's first request computes its 36 tokens; the 3 others start from the prefix's 2 cached blocks
    # of 16 (the engine's block size) and compute 4 each
    assert pair["prefix_cache"] == {"prompt_tokens": 16 * 36, "hit_tokens": 4 * 3 * 32}
    assert pair["prefill_tokens"] == [4 * 36 + 12 * 4, 16 * 36]
    assert "prefix cache on vs off" in capsys.readouterr().out
    assert main([*argv, "--out", str(out)], log=lambda m: None) == 0  # no shared prefix: nothing to reuse
    (pair,) = json.loads(out.read_text())["prefix_cache_ab"]
    assert pair["target"] == 0.98 and pair["prefix_cache"]["hit_tokens"] == 0
