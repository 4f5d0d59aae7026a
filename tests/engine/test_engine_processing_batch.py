"""Every sampling parameter keeps batch invariance (a row gets what it gets alone, with run-ahead on and off),
preemption + recompute rebuilds the token history exactly, and stop_token_ids / min_tokens / eos / stop strings
interact as vLLM's do. CPU fp32, real Engine on a tiny Llama with PEFT adapters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from tests.builders import build_mixed
from tests.engine.test_engine_penalties import EOS, prompts

MIXED = [  # (adapter, sampling): every row different
    ("qv8", dict(repetition_penalty=1.4)),
    (None, dict(temperature=0.9, frequency_penalty=1.0, presence_penalty=0.5, min_p=0.05, seed=1)),
    ("all4rs", dict(temperature=1.2, top_p=0.8, min_p=0.2, seed=2)),
    ("mlp16", dict(logit_bias={"17": 4.0, "18": -100})),
    ("qv8", dict(temperature=0.7, min_tokens=5, stop_token_ids=[30, 31], seed=3)),
    (None, {}),
    ("all4rs", dict(temperature=1.0, seed=4)),
    ("mlp16", dict(temperature=1.1, top_k=20, repetition_penalty=0.9, presence_penalty=-0.5, seed=5)),
    (None, dict(temperature=0.8, logit_bias={str(EOS): 6.0}, min_tokens=3, seed=6)),
    ("qv8", dict(temperature=1.0, top_k=1, frequency_penalty=2.0)),  # top_k 1: argmax of the processed logits
]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build_mixed(tmp_path_factory.mktemp("llama"), "llama")


def engine(llama, **kw) -> Engine:
    base, adapters = llama
    cfg = dict(model=str(base), device="cpu", max_loras=3, max_lora_rank=16, seed=11, max_num_seqs=16)
    return Engine(EngineConfig(**{**cfg, **kw}), adapters)


def requests(ps, mixed, max_tokens=14) -> list[Request]:
    return [
        Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=SamplingParams(max_tokens=max_tokens, **sp))
        for i, (p, (a, sp)) in enumerate(zip(ps, mixed))
    ]


def outcome(results) -> list[tuple]:
    assert [r.error for r in results] == [None] * len(results)
    return [(r.token_ids, r.finish_reason, r.completion_tokens) for r in results]


@pytest.mark.parametrize("run_ahead", [True, False])
def test_mixed_parameters_batch_invariance(llama, run_ahead):
    ps = prompts(len(MIXED), seed=7)
    eng = engine(llama, run_ahead=run_ahead)
    together = outcome(eng.generate_all(requests(ps, MIXED)))
    alone = [outcome(eng.generate_all(requests([p], [m])))[0] for p, m in zip(ps, MIXED)]
    assert together == alone
    shuffled = [9, 3, 0, 7, 5, 1, 8, 2, 6, 4]
    got = outcome(eng.generate_all(requests([ps[i] for i in shuffled], [MIXED[i] for i in shuffled])))
    assert got == [alone[i] for i in shuffled]
    if run_ahead:
        assert eng.stats.ahead_steps > 0
    else:
        assert eng.stats.ahead_steps == 0
    plain = outcome(eng.generate_all(requests(ps, [(a, {}) for a, _ in MIXED])))
    assert sum(x != y for x, y in zip(together, plain)) >= 8  # the parameters really changed the rows


def test_same_results_with_and_without_run_ahead(llama):
    ps = prompts(len(MIXED), seed=8)
    a = outcome(engine(llama, run_ahead=True).generate_all(requests(ps, MIXED)))
    b = outcome(engine(llama, run_ahead=False).generate_all(requests(ps, MIXED)))
    assert a == b


def test_preemption_rebuilds_the_token_history(llama):
    """A KV cache too small for every sequence at once: sequences with penalties are preempted, recomputed and
    their history rows rewritten from their tokens (rows taken back and handed on: max_num_seqs 4), and every
    output equals the roomy run's."""
    mixed = [MIXED[i] for i in (0, 1, 7, 9, 3, 8)] * 2
    ps = prompts(len(mixed), seed=9)
    roomy = engine(llama)
    want = outcome(roomy.generate_all(requests(ps, mixed, max_tokens=20)))
    tight = engine(
        llama,
        block_size=4,
        num_kv_blocks=18,
        max_num_seqs=4,
        # reads on the step loop's thread: which rows run together (so whether the cache overflows)
        # must not depend on read timing
        prefetch_threads=0,
    )
    got = outcome(tight.generate_all(requests(ps, mixed, max_tokens=20)))
    assert got == want
    assert tight.stats.preemptions > 0 and roomy.stats.preemptions == 0
    assert tight.runner.history.rows_in_use <= 4


def _free_run(eng, p, **sp):
    return eng.generate_all([Request(key=0, id="f", prompt_token_ids=p, sampling=SamplingParams(**sp))])[0]


def test_stop_token_ids_min_tokens_and_eos(llama):
    eng = engine(llama)
    p = prompts(1, seed=10)[0]
    free = _free_run(eng, p, max_tokens=16, ignore_eos=True)
    toks = free.token_ids
    k = next(i for i in range(2, len(toks)) if toks[i] not in toks[:i])  # a token first generated at position k
    t = toks[k]
    # a stop token ends the completion like eos: counted, not in the text nor the ids
    r = _free_run(eng, p, max_tokens=16, ignore_eos=True, stop_token_ids=[t])
    assert (r.finish_reason, r.completion_tokens, r.token_ids) == ("stop", k + 1, toks[:k])
    assert r.text == eng.tokenizer.decode(toks[:k], skip_special_tokens=True)
    # ... and is banned before min_tokens: the completion runs past position k
    r = _free_run(eng, p, max_tokens=16, ignore_eos=True, stop_token_ids=[t], min_tokens=k + 1)
    assert r.token_ids[:k] == toks[:k] and r.token_ids[k] != t and r.completion_tokens >= k + 2
    assert t not in r.token_ids[: k + 1]
    # eos pushed to the top: it comes exactly at min_tokens; ignore_eos makes it an ordinary token (not banned)
    r = _free_run(eng, p, max_tokens=16, logit_bias={EOS: 50}, min_tokens=6)
    assert (r.finish_reason, r.completion_tokens, len(r.token_ids)) == ("stop", 7, 6) and EOS not in r.token_ids
    r = _free_run(eng, p, max_tokens=8, logit_bias={EOS: 50}, min_tokens=6, ignore_eos=True)
    assert r.finish_reason == "length" and r.token_ids == [EOS] * 8
    # stop_token_ids still stop with ignore_eos; eos in stop_token_ids stops though ignore_eos is set
    r = _free_run(eng, p, max_tokens=8, logit_bias={EOS: 50}, ignore_eos=True, stop_token_ids=[EOS])
    assert (r.finish_reason, r.completion_tokens, r.token_ids) == ("stop", 1, [])


def test_stop_strings_are_not_matched_before_min_tokens(llama):
    eng = engine(llama)
    p = prompts(1, seed=12)[0]
    free = _free_run(eng, p, max_tokens=16, ignore_eos=True)
    words = free.text.split()
    assert len(words) == 16  # the word-level test tokenizer: one word per token
    stop = words[1]
    later = [i for i in range(4, 16) if words[i] == stop]
    r = _free_run(eng, p, max_tokens=16, ignore_eos=True, stop=[stop], min_tokens=5)
    if later:  # matched again once 5 tokens are out (a string ending in the 5th token or later)
        assert r.finish_reason == "stop" and r.text == free.text[: free.text.index(stop, len(" ".join(words[:4])))]
    else:
        assert r.finish_reason == "length" and r.text == free.text
    assert r.token_ids[:5] == free.token_ids[:5]
    r = _free_run(eng, p, max_tokens=16, ignore_eos=True, stop=[stop])
    assert r.finish_reason == "stop" and r.text == free.text[: free.text.index(stop)]


def test_greedy_rows_take_the_fast_path_only_without_processing(llama):
    from multilora_cli.engine.sequence import Sequence
    from multilora_cli.engine.step_logits import all_greedy

    def seq(**sp):
        return Sequence.from_request(0, Request(key=0, id="a", sampling=SamplingParams(**sp)), [1, 2])

    assert all_greedy([seq(), seq(temperature=0.5, top_k=1)])
    for sp in (dict(repetition_penalty=1.1), dict(logit_bias={3: 1}), dict(min_tokens=1), dict(presence_penalty=1)):
        assert not all_greedy([seq(), seq(**sp)])
    assert replace(SamplingParams(), min_p=0.5).processes_logits is False  # min_p alone changes no argmax
