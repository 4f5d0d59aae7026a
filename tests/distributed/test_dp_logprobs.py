"""Logprobs, prompt logprobs, scores and echo text travel from a worker to rank 0 (distributed/protocol.py)
unchanged, through pickling as the pipes do."""

from __future__ import annotations

import pickle

from multilora_cli.distributed.protocol import pack_result, unpack_result
from multilora_cli.engine.request import Result, Sample, Score, TokenLogprob


def _trip(r: Result) -> Result:
    return unpack_result(pickle.loads(pickle.dumps(pack_result(r))))


def test_logprobs_and_scores_survive_the_trip():
    lp = [TokenLogprob(5, -0.5, [(5, " a", -0.5), (6, " b", -1.5)], " a")]
    prompt = [TokenLogprob(1, None, [], "<s>"), TokenLogprob(9, -3.0, [(2, " c", -1.0)], " d")]
    one = Result(1, "x", "legal", " a", [5], "length", 2, 1, samples=[Sample(0, " a", [5], "length", 1, lp)])
    one.prompt_logprobs, one.echo_text = prompt, "w1"
    assert _trip(one) == one
    two = Result(
        2,
        "y",
        None,
        " a",
        [5],
        "length",
        2,
        2,
        samples=[Sample(0, " a", [5], "length", 1, lp), Sample(1, " a", [5], "length", 1, lp)],
    )
    assert _trip(two) == two
    scored = Result(3, "s", "code", finish_reason="length", prompt_tokens=7, score=Score(-2.5, False, [-1.0, -1.5]))
    assert _trip(scored) == scored and _trip(scored).samples == []
