"""generation_config.json fields multilora does not apply (no_repeat_ngram_size, ...) are named in one warning at
the start of a run, never dropped silently; the run goes on (a model-level default is not a line's request). Those
it applies (repetition_penalty, min_new_tokens, min_p with do_sample) are not named, and change the output."""

from __future__ import annotations

import json
import shutil

import pytest

from multilora_cli.engine.generation_config import read_generation_config
from multilora_cli.models.generation_unapplied import unapplied, unapplied_warning
from tests.run.helpers import read_jsonl, run_cli


@pytest.mark.parametrize(
    "gc, want",
    [
        ({"repetition_penalty": 1.05}, []),  # served
        ({"encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "num_beams": 1, "bad_words_ids": None}, []),
        ({"no_repeat_ngram_size": 3, "num_beams": 4}, ["no_repeat_ngram_size=3", "num_beams=4"]),
        ({"min_new_tokens": 2, "min_length": 3, "bad_words_ids": [[5]]}, ["min_length=3", "bad_words_ids=[[5]]"]),
        ({"typical_p": 0.9}, []),  # sampling-only: greedy without do_sample, as in transformers
        ({"do_sample": True, "min_p": 0.1, "typical_p": 0.9}, ["typical_p=0.9"]),
        ({"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_new_tokens": 9}, []),  # served
    ],
)
def test_unapplied_fields(gc, want):
    assert unapplied(gc) == want


def test_warning_names_the_file_and_fields(tmp_path):
    assert unapplied_warning(tmp_path) is None  # no file
    (tmp_path / "generation_config.json").write_text("{not json")
    assert unapplied_warning(tmp_path) is None  # the run's own read reports it
    (tmp_path / "generation_config.json").write_text(json.dumps({"no_repeat_ngram_size": 3, "do_sample": False}))
    w = unapplied_warning(tmp_path)
    assert w == (
        f"{tmp_path / 'generation_config.json'}: no_repeat_ngram_size=3 is not applied (multilora does not serve it "
        "yet), so outputs differ from transformers' generate with this file; the run goes on without it"
    )
    gen = read_generation_config(tmp_path)
    assert gen.not_applied == ["no_repeat_ngram_size=3"] and gen.sampling == {"temperature": 0.0}  # do_sample kept


def test_run_warns_once_at_start_and_goes_on(model_dir, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(model_dir / "base", base)
    gc = json.loads((base / "generation_config.json").read_text())
    (base / "generation_config.json").write_text(json.dumps({**gc, "no_repeat_ngram_size": 2}))
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": 1, "prompt": "The court held that", "max_tokens": 4}) + "\n")
    rc, out, err = run_cli(["run", str(inp), "-m", str(base), "--device", "cpu", "-q"])
    assert rc == 0, err
    assert "error" not in read_jsonl(out)[0]
    warned = [line for line in err.splitlines() if "no_repeat_ngram_size=2 is not applied" in line]
    assert (
        len(warned) == 1
        and warned[0].startswith("multilora: warning: ")
        and str(base / "generation_config.json") in warned[0]
    )


def test_run_applies_the_repetition_penalty_of_generation_config(model_dir, tmp_path):
    """A file's repetition_penalty (Qwen2.5's sets 1.05) is applied, without a warning, as transformers' generate
    applies it, and a line's own value wins over it. (This random model never repeats itself unpushed: a
    penalty below 1, which favours repeats, is what shows.)"""
    base = tmp_path / "base"
    shutil.copytree(model_dir / "base", base)
    inp = tmp_path / "in.jsonl"
    lines = [{"id": i, "prompt": "The court held that the", "max_tokens": 24} for i in range(2)]
    lines[1]["repetition_penalty"] = 1.0
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rc, plain, err = run_cli(["run", str(inp), "-m", str(base), "--device", "cpu", "-q"])
    assert rc == 0, err
    gc = json.loads((base / "generation_config.json").read_text())
    (base / "generation_config.json").write_text(json.dumps({**gc, "repetition_penalty": 0.3}))
    rc, out, err = run_cli(["run", str(inp), "-m", str(base), "--device", "cpu", "-q"])
    assert rc == 0 and "not applied" not in err, err
    before, after = read_jsonl(plain), read_jsonl(out)
    assert after[0]["text"] != before[0]["text"] and after[1]["text"] == before[1]["text"]
