"""generation_config.json fields multilora does not apply (repetition_penalty, ...) are named in one warning at the
start of a run, never dropped silently; the run goes on (a model-level default is not a line's request)."""

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
        ({"repetition_penalty": 1.05}, ["repetition_penalty=1.05"]),
        ({"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "num_beams": 1, "bad_words_ids": None}, []),
        ({"no_repeat_ngram_size": 3, "num_beams": 4}, ["no_repeat_ngram_size=3", "num_beams=4"]),
        ({"min_new_tokens": 2, "min_length": 0, "bad_words_ids": [[5]]}, ["min_new_tokens=2", "bad_words_ids=[[5]]"]),
        ({"min_p": 0.1, "typical_p": 0.9}, []),  # sampling-only: greedy without do_sample, as in transformers
        ({"do_sample": True, "min_p": 0.1, "typical_p": 1.0}, ["min_p=0.1"]),
        ({"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_new_tokens": 9}, []),  # served
    ],
)
def test_unapplied_fields(gc, want):
    assert unapplied(gc) == want


def test_warning_names_the_file_and_fields(tmp_path):
    assert unapplied_warning(tmp_path) is None  # no file
    (tmp_path / "generation_config.json").write_text("{not json")
    assert unapplied_warning(tmp_path) is None  # the run's own read reports it
    (tmp_path / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.1, "do_sample": False}))
    w = unapplied_warning(tmp_path)
    assert w == (
        f"{tmp_path / 'generation_config.json'}: repetition_penalty=1.1 is not applied (multilora does not serve it "
        "yet), so outputs differ from transformers' generate with this file; the run goes on without it"
    )
    gen = read_generation_config(tmp_path)
    assert gen.not_applied == ["repetition_penalty=1.1"] and gen.sampling == {"temperature": 0.0}  # do_sample kept


def test_run_warns_once_at_start_and_goes_on(model_dir, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(model_dir / "base", base)
    gc = json.loads((base / "generation_config.json").read_text())
    (base / "generation_config.json").write_text(json.dumps({**gc, "repetition_penalty": 1.05}))
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": 1, "prompt": "The court held that", "max_tokens": 4}) + "\n")
    rc, out, err = run_cli(["run", str(inp), "-m", str(base), "--device", "cpu", "-q"])
    assert rc == 0, err
    assert "error" not in read_jsonl(out)[0]
    warned = [line for line in err.splitlines() if "repetition_penalty=1.05 is not applied" in line]
    assert (
        len(warned) == 1
        and warned[0].startswith("multilora: warning: ")
        and str(base / "generation_config.json") in warned[0]
    )
