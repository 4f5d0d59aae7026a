"""benchmarks/bench_grammar.py on the CPU at tiny shapes: it runs both arms on one engine, the constrained arm
generates exactly as many tokens as the free one (its schemas cannot complete within the output length), and the
report carries the ratio, the mask timings and a compile time per distinct schema; the synthetic byte-level
tokenizer has exactly the preset's vocabulary and decodes every id."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_grammar import main
from multilora_cli.bench.byte_vocab import byte_level_tokenizer


def test_byte_level_tokenizer_has_the_vocab_and_decodes_every_piece():
    tok = byte_level_tokenizer(700)
    assert tok.get_vocab_size() == 700
    assert tok.decode([2]) == "" and tok.decode([3 + ord("{")]) == "{"  # </s> is special; then the 256 bytes
    assert all(tok.decode([i]) for i in range(3 + 256, 700))


@pytest.mark.slow
def test_bench_grammar_runs_both_arms(tmp_path):
    out = tmp_path / "g.json"
    argv = ["--preset", "tiny", "--adapters", "2", "--batch", "4", "--requests", "8", "--prompt-len", "8"]
    rep = main([*argv, "--output-len", "8", "--schemas", "3", "--rounds", "1", "--device", "cpu", "--out", str(out)])
    assert json.loads(out.read_text())["ratio"] == rep["ratio"] > 0
    free, js = rep["runs"]["free"][0], rep["runs"]["json_schema"][0]
    assert free["tokens"] == js["tokens"] == 8 * 8
    assert js["masks"] > 0 and js["fill_s"] > 0
    assert set(rep["compile_ms"]) == {"bench0", "bench1", "bench2", "flat", "enum", "nested"}
