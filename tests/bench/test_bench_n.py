"""The n benchmark pair on CPU (tiny preset): n samples a prompt vs n separate requests of it draw the same texts,
feed the prompt once vs n times, and `benchmarks.bench_e2e --n` reports the pair. Numbers mean nothing here."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from multilora_cli.bench.model_dir import write_model_dir
from multilora_cli.bench.workload import Workload
from multilora_cli.config import EngineConfig
from multilora_cli.engine.engine import Engine
from multilora_cli.errors import ConfigError

W = Workload(preset="tiny", num_adapters=0, num_requests=12, prompt_len=21, output_len=5, temperature=1.0, n=4)


def test_workload_pair_requests():
    one, sep = W.requests(512), replace(W, separate_n=True).requests(512)
    assert len(one) == 3 and all(r.sampling.n == 4 for r in one)
    assert len(sep) == 12 and all(r.sampling.n == 1 for r in sep)
    assert [r.prompt_token_ids for r in sep] == [r.prompt_token_ids for r in one for _ in range(4)]
    assert [r.key for r in sep] == list(range(12))
    assert replace(W, n=1).requests(512)[0].sampling.seed == one[0].sampling.seed
    with pytest.raises(ConfigError, match="n must be in 1..128"):
        replace(W, n=13)


def test_pair_draws_the_same_texts_and_shares_the_prefill(tmp_path):
    model = write_model_dir("tiny", tmp_path / "tiny")
    cfg = EngineConfig(model=str(model), device="cpu", load_format="dummy", block_size=4, max_loras=1)
    eng = Engine(cfg)
    ns = eng.generate_all(W.requests(eng.model_config.vocab_size))
    sep = eng.generate_all(replace(W, separate_n=True).requests(eng.model_config.vocab_size))
    assert [s.token_ids for r in ns for s in r.samples] == [r.token_ids for r in sep]
    assert eng.scheduler.num_forks == 3 and eng.block_manager.num_shared == 3 * 3 * 5


def test_bench_e2e_n_pair(tmp_path, capsys):
    from benchmarks.bench_e2e import main

    out = tmp_path / "e2e.json"
    argv = ["--preset", "tiny", "--device", "cpu", "--rows", "2", "--n", "4", "--requests", "8"]
    argv += ["--prompt-len", "20", "--output-len", "3", "--max-num-seqs", "8", "--temperature", "1.0"]
    argv += ["--no-prefix-cache"]  # separate requests of one prompt would share its blocks through the cache
    assert main([*argv, "--out", str(out)], log=lambda m: None) == 0
    report = json.loads(out.read_text())
    a, b = report["rows"]
    assert (a["workload"]["n"], a["workload"]["separate_n"], b["workload"]["separate_n"]) == (4, False, True)
    assert a["output_tokens"] == b["output_tokens"] == 8 * 3
    (pair,) = report["n_vs_separate"]
    # 2 prompts of 20 tokens: once each plus 3 forks recomputing the last partial block (4 tokens), vs 8 times
    assert pair["prefill_tokens"] == [2 * 20 + 2 * 3 * 4, 8 * 20] and pair["ratio"] > 0
    assert "n=4 vs 4 separate requests" in capsys.readouterr().out
