"""engine/scoring.py: (context, continuation) tokenized as lm-evaluation-harness' `_encode_pair` does, on the demo's
BPE tokenizer (merges across the boundary happen there), and the requests a scoring line cannot be."""

from __future__ import annotations

import pytest

from multilora_cli.config import SamplingParams
from multilora_cli.engine.request import Request
from multilora_cli.engine.scoring import encode_pair, scoring_ids
from multilora_cli.engine.tokenizer import Tokenizer
from multilora_cli.errors import RequestError


@pytest.fixture(scope="module")
def tok(model_dir):
    return Tokenizer.from_dir(model_dir / "base")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.run.helpers import build_model_dir

    return build_model_dir(tmp_path_factory.mktemp("scoring_tok"))


@pytest.mark.parametrize(
    "ctx, cont",
    [
        ("The court held", " that the tenant"),
        ("The court held th", "at"),
        ("The court held ", "that"),
        ("Hi", " there"),
    ],
)
def test_encode_pair_splits_whole_at_the_context_length(tok, ctx, cont):
    ids, n_ctx = encode_pair(tok, ctx, cont)
    spaces = len(ctx) - len(ctx.rstrip())  # lm-eval moves the context's trailing spaces to the continuation
    ctx, cont = (ctx[:-spaces], ctx[-spaces:] + cont) if spaces else (ctx, cont)
    assert ids == tok.encode(ctx + cont) and n_ctx == len(tok.encode(ctx))


def test_empty_context_is_the_prefix_token(tok):
    ids, n_ctx = encode_pair(tok, "", "The court")
    assert n_ctx == 1 and ids == [tok.bos_token_id, *tok.encode("The court", add_special_tokens=False)]


def test_requests_that_cannot_be_scored(tok):
    def req(**kw):
        return Request(key=0, id="r", **{"prompt": "The court", **kw})

    assert scoring_ids(tok, req(continuation=" held"))[1] == len(tok.encode("The court"))
    with pytest.raises(RequestError, match="no token of its own"):
        scoring_ids(tok, req(continuation=""))
    with pytest.raises(RequestError, match="text 'prompt'"):
        scoring_ids(tok, req(prompt=None, prompt_token_ids=[5, 6], continuation="x"))
    with pytest.raises(RequestError, match="no n"):
        scoring_ids(tok, req(continuation="x", sampling=SamplingParams(n=2, temperature=1.0)))
