"""benchmarks/bench_scoring.py runs end to end on the CPU with the tiny preset (the GPU run is the lead's): both
parts report their numbers, and the scoring requests it builds tokenize back to its ids (the word-level bench
tokenizer), so the engine scores exactly the continuation it was given."""

from __future__ import annotations

import json

from benchmarks.bench_scoring import main, scoring_requests, scoring_rows
from multilora_cli.bench.model_dir import write_model_dir
from multilora_cli.engine.scoring import scoring_ids
from multilora_cli.engine.tokenizer import Tokenizer


def test_scoring_requests_tokenize_to_their_ids(tmp_path):
    tok = Tokenizer.from_dir(write_model_dir("tiny", tmp_path / "tiny"))
    rows = scoring_rows(3, 8, 2, 512, seed=0)
    for (ctx, cont), req in zip(rows, scoring_requests(rows, [None] * 3)):
        assert scoring_ids(tok, req) == (ctx + cont, len(ctx))


def test_bench_scoring_smoke(tmp_path, capsys):
    out = tmp_path / "scoring.json"
    argv = ["--preset", "tiny", "--device", "cpu", "--requests", "8", "--context-len", "16", "--continuation-len", "2"]
    argv += ["--gen-requests", "4", "--prompt-len", "8", "--output-len", "3", "--adapters", "2", "--repeats", "1"]
    argv += ["--hf-batch", "2", "--hf-batches", "1", "--max-num-seqs", "8"]
    assert main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["scoring_multilora"]["prompt_tokens"] == 8 * 18
    assert report["scoring_hf_peft"]["prompt_tokens"] == 2 * 18
    assert report["scoring_ratio"]["target"] == 10.0 and report["scoring_ratio"]["ratio"] > 0
    gen = report["generation_logprobs"]
    assert set(gen["tokens_per_s"]) == {"plain", "logprobs5"} and gen["ratio"] > 0
    assert report["logprob_lm_head"]["path"] == "one_gemm"  # (fp32 on the CPU: the sampler's GEMM is the fp32 one)
