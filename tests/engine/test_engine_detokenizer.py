"""Incremental detokenization and stop checking (eos, stop strings, max_tokens) with real tokenizers."""

from __future__ import annotations

import pytest

from multilora_cli.config import SamplingParams
from multilora_cli.engine.detokenizer import IncrementalDecoder, StopChecker, find_stop
from multilora_cli.engine.request import Request
from multilora_cli.engine.sequence import Sequence
from multilora_cli.engine.tokenizer import Tokenizer
from tests.engine.engine_tok import TEXT, write_chatml_dir, write_llama3_dir


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    root = tmp_path_factory.mktemp("detok")
    return {
        "bytelevel": Tokenizer.from_dir(write_llama3_dir(root / "l3")),
        "metaspace": Tokenizer.from_dir(write_chatml_dir(root / "ms", metaspace=True)),
    }


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_incremental_text_equals_full_decode_and_never_splits_characters(toks, kind):
    tok = toks[kind]
    for text in TEXT:
        ids = tok.encode(text, add_special_tokens=False)
        dec = IncrementalDecoder(tok)
        pieces = [dec.push([t]) for t in ids]
        assert "".join(pieces) == dec.text == tok.decode(ids)
        assert all("\ufffd" not in p for p in pieces)


def test_multibyte_characters_are_held_back(toks):
    tok = toks["bytelevel"]
    ids = tok.encode("🌍", add_special_tokens=False)
    assert len(ids) > 1  # the tiny vocabulary splits the 4 UTF-8 bytes
    dec = IncrementalDecoder(tok)
    assert [dec.push([t]) for t in ids[:-1]] == [""] * (len(ids) - 1)
    assert dec.push(ids[-1:]) == "🌍"


def test_find_stop_only_looks_at_new_text():
    assert find_stop("abc### END", ["### END"], new_from=5) == 3
    assert find_stop("abc### END", ["### END", "c#"], new_from=3) == 2
    assert find_stop("xx", ["x"], new_from=2) == -1  # already checked


def run_tokens(tok, ids, sp, max_model_len=None, eos=()):
    checker = StopChecker(tok, eos_token_ids=eos, max_model_len=max_model_len)
    seq = Sequence.from_request(0, Request(key=0, id="r", sampling=sp), [1, 2, 3])
    for t in ids:
        seq.append_token(t)
        reason = checker(seq)
        if reason:
            return seq, reason
    return seq, None


def test_stop_string_spanning_tokens_truncates(toks):
    tok = toks["bytelevel"]
    text = "Stop here: ### END ### and continue"
    ids = tok.encode(text, add_special_tokens=False)
    seq, reason = run_tokens(tok, ids, SamplingParams(max_tokens=100, stop=["### END"]))
    assert reason == "stop" and seq.text == "Stop here: "
    # finished as soon as the stop string was complete, not later
    assert "### END" in tok.decode(seq.output_token_ids)
    assert "### END" not in tok.decode(seq.output_token_ids[:-1])


def test_eos_max_tokens_and_max_model_len(toks):
    tok = toks["bytelevel"]
    eot = tok.backend.token_to_id("<|eot_id|>")
    ids = tok.encode("héllo wörld", add_special_tokens=False)
    seq, reason = run_tokens(tok, ids + [eot, 7], SamplingParams(max_tokens=100), eos=tok.eos_token_ids)
    assert reason == "stop" and seq.text == "héllo wörld" and seq.output_token_ids[-1] == eot
    seq, reason = run_tokens(
        tok, ids + [eot, *ids], SamplingParams(max_tokens=len(ids) + 3, ignore_eos=True), eos=tok.eos_token_ids
    )
    assert reason == "length" and seq.num_completion_tokens == len(ids) + 3
    seq, reason = run_tokens(tok, ids, SamplingParams(max_tokens=100), max_model_len=5)
    assert reason == "length" and seq.num_tokens == 5 and seq.text == tok.decode(ids[:2])
