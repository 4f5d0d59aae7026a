"""Logprobs, prompt logprobs and scoring (engine/logprobs.py, engine/scoring.py) equal HF transformers + PEFT.

One mixed-adapter batch (base + the three PEFT adapters of tests/builders.py: q/v r8, all-linear rsLoRA,
rank_pattern) on the CPU in fp32: every completion logprob, top-k set and prompt logprob equals log_softmax of
HF's logits for that row to 1e-4, the same row alone gives the same numbers, and scoring's logprob / is_greedy
are HF's. A small token budget splits the prompts into several prefill chunks.
"""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from multilora_cli.engine.scoring import encode_pair
from tests.builders import build_mixed, load_peft

PLAN = ["qv8", None, "all4rs", "mlp16", "all4rs", None]
TOL = 1e-4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base, adapters = build_mixed(tmp_path_factory.mktemp("lp"))
    cfg = EngineConfig(model=str(base), device="cpu", max_loras=4, max_lora_rank=16, max_num_batched_tokens=16)
    engine = Engine(cfg, adapters)
    yield engine, load_peft(base, adapters)
    engine.close()


def _hf_logprobs(pm, adapter, ids) -> torch.Tensor:
    """[len(ids), V] fp32 log_softmax of HF + PEFT logits over `ids` (row j predicts ids[j + 1])."""
    with torch.no_grad():
        if adapter is None:
            with pm.disable_adapter():
                logits = pm(input_ids=torch.tensor([ids])).logits[0]
        else:
            pm.set_adapter(adapter)
            logits = pm(input_ids=torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def _check_entry(entry, lp_row: torch.Tensor, token: int, k: int) -> None:
    assert entry.id == token
    assert abs(entry.logprob - lp_row[token].item()) < TOL
    top = torch.topk(lp_row, k)
    assert [t for t, _, _ in entry.top] == top.indices.tolist()
    assert all(abs(v - w) < TOL for (_, _, v), w in zip(entry.top, top.values.tolist()))


def _requests(k: int = 3):
    g = torch.Generator().manual_seed(1)
    out = []
    for i, a in enumerate(PLAN):
        prompt = torch.randint(3, 256, (5 + 3 * i,), generator=g).tolist()
        sp = dict(max_tokens=4, ignore_eos=True, logprobs=k, prompt_logprobs=k - 1)
        if i % 3 == 2:  # sampled rows: logprobs stay the raw model's, whatever the temperature and top-k
            sp.update(temperature=0.8, top_k=20, seed=i)
        out.append(Request(key=i, id=str(i), adapter=a, prompt_token_ids=prompt, sampling=SamplingParams(**sp)))
    return out


def test_completion_and_prompt_logprobs_match_hf(setup):
    engine, pm = setup
    reqs = _requests()
    got = engine.generate_all(reqs)
    for req, res in zip(reqs, got):
        assert res.error is None
        prompt, out = req.prompt_token_ids, res.token_ids
        lp = _hf_logprobs(pm, req.adapter, prompt + out)
        entries = res.samples[0].logprobs
        assert len(entries) == len(out) == 4
        for i, e in enumerate(entries):
            _check_entry(e, lp[len(prompt) - 1 + i], out[i], 3)
        first = res.prompt_logprobs[0]
        assert (first.id, first.logprob, first.top) == (prompt[0], None, [])
        assert len(res.prompt_logprobs) == len(prompt)
        for j, e in enumerate(res.prompt_logprobs[1:], start=1):
            _check_entry(e, lp[j - 1], prompt[j], 2)


def test_row_alone_gives_the_same_numbers(setup):
    engine, _ = setup
    reqs = _requests()
    together = engine.generate_all(reqs)
    for req, res in zip(reqs, together):
        alone = engine.generate_all([req])[0]
        assert alone.token_ids == res.token_ids
        for a, b in zip(
            alone.samples[0].logprobs + alone.prompt_logprobs[1:], res.samples[0].logprobs + res.prompt_logprobs[1:]
        ):
            assert abs(a.logprob - b.logprob) < TOL and [t for t, _, _ in a.top] == [t for t, _, _ in b.top]


def test_rows_without_logprobs_get_none(setup):
    engine, _ = setup
    req = Request(key=0, id="0", prompt_token_ids=[4, 5, 6], sampling=SamplingParams(max_tokens=2))
    res = engine.generate_all([req])[0]
    assert res.samples[0].logprobs is None and res.prompt_logprobs is None and res.score is None


def test_a_stop_token_drops_its_logprob_with_it(setup):
    """One entry per returned token id: a stop token (not in the ids) takes its entry along, also when a step was
    launched ahead past it (EngineConfig.run_ahead)."""
    engine, _ = setup
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13]]
    plain = engine.generate_all(
        [
            Request(key=i, id=str(i), prompt_token_ids=p, sampling=SamplingParams(max_tokens=6, ignore_eos=True))
            for i, p in enumerate(prompts)
        ]
    )
    stops = [r.token_ids[2] for r in plain]
    reqs = [
        Request(
            key=i,
            id=str(i),
            prompt_token_ids=p,
            sampling=SamplingParams(max_tokens=6, ignore_eos=True, stop_token_ids=[stops[i]], logprobs=1),
        )
        for i, p in enumerate(prompts)
    ]
    for r, ref, stop in zip(engine.generate_all(reqs), plain, stops):
        cut = ref.token_ids.index(stop)  # (the stop token may come before position 2 too)
        assert r.token_ids == ref.token_ids[:cut] and r.finish_reason == "stop"
        assert [e.id for e in r.samples[0].logprobs] == r.token_ids


def test_preemption_keeps_one_entry_per_token(setup, tmp_path):
    """A KV cache too small for every row at once: preempted rows recompute prompt + output, and their prompt
    and completion logprobs are each position's once, equal to an unconstrained run's."""
    engine, _ = setup
    cfg = engine.config
    small = Engine(
        EngineConfig(
            model=cfg.model,
            device="cpu",
            max_loras=4,
            max_lora_rank=16,
            num_kv_blocks=8,
            block_size=4,
            # reads on the step loop's thread: which rows run together (so whether the cache overflows)
            # must not depend on read timing
            prefetch_threads=0,
        ),
        engine.adapters,
    )
    try:
        sp = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=2, prompt_logprobs=1)
        reqs = [
            Request(key=i, id=str(i), adapter=a, prompt_token_ids=list(range(20 + i, 30 + i)), sampling=sp)
            for i, a in enumerate(PLAN)
        ]
        got = small.generate_all(reqs)
        assert small.stats.preemptions > 0
    finally:
        small.close()
    want = engine.generate_all(reqs)
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids and len(a.prompt_logprobs) == len(b.prompt_logprobs) == 10
        pa = a.samples[0].logprobs + a.prompt_logprobs[1:]
        pb = b.samples[0].logprobs + b.prompt_logprobs[1:]
        assert [e.id for e in pa] == [e.id for e in pb]
        assert all(abs(x.logprob - y.logprob) < TOL for x, y in zip(pa, pb))


def test_n_samples_each_get_their_logprobs(setup):
    engine, pm = setup
    sp = SamplingParams(max_tokens=3, ignore_eos=True, n=3, temperature=1.0, seed=5, logprobs=1)
    req = Request(key=0, id="0", adapter="mlp16", prompt_token_ids=[7, 8, 9, 10, 11], sampling=sp)
    res = engine.generate_all([req])[0]
    assert len(res.samples) == 3
    for s in res.samples:
        lp = _hf_logprobs(pm, "mlp16", [7, 8, 9, 10, 11] + s.token_ids)
        for i, e in enumerate(s.logprobs):
            _check_entry(e, lp[4 + i], s.token_ids[i], 1)


def test_scoring_matches_hf_in_a_mixed_batch(setup):
    engine, pm = setup
    pairs = [("w1 w2 w3", " w4 w5"), ("w9 w8 w7 w6 w5 w4 w3 w2 w1 w0", " w11"), ("w3 ", "w3 w3 w3"), ("", "w5 w6")]
    reqs = []
    for i, (ctx, cont) in enumerate(pairs):
        reqs.append(Request(key=2 * i, id=f"s{i}", adapter=PLAN[i], prompt=ctx, continuation=cont))
        # a generation line beside each scoring line
        gen = SamplingParams(max_tokens=2, ignore_eos=True, logprobs=1)
        reqs.append(Request(key=2 * i + 1, id=f"g{i}", adapter=PLAN[i + 1], prompt=ctx + cont, sampling=gen))
    got = engine.generate_all(reqs)
    for req, res in zip(reqs[::2], got[::2]):
        assert res.error is None and res.token_ids == [] and res.completion_tokens == 0
        whole, n_ctx = encode_pair(engine.tokenizer, req.prompt, req.continuation)
        lp = _hf_logprobs(pm, req.adapter, whole[:-1])
        want = [lp[n_ctx - 1 + j, t].item() for j, t in enumerate(whole[n_ctx:])]
        greedy = bool((lp[n_ctx - 1 :].argmax(-1) == torch.tensor(whole[n_ctx:])).all())
        assert res.score.num_tokens == len(want) == len(res.score.token_logprobs)
        assert all(abs(a - b) < TOL for a, b in zip(res.score.token_logprobs, want))
        assert abs(res.score.logprob - sum(want)) < TOL and res.score.is_greedy == greedy
        assert res.prompt_tokens == len(whole)
    assert all(r.error is None and len(r.samples[0].logprobs) == 2 for r in got[1::2])


def test_greedy_continuation_is_greedy(setup):
    """A continuation made of the model's own greedy tokens scores is_greedy true; one token changed, false."""
    engine, _ = setup
    ctx = "w10 w20 w30"
    gen = engine.generate_all(
        [Request(key=0, id="g", prompt=ctx, sampling=SamplingParams(max_tokens=3, ignore_eos=True))]
    )[0]
    other = [gen.token_ids[0], gen.token_ids[1], gen.token_ids[2] + 1]
    cont, changed = (" " + engine.tokenizer.decode(ids) for ids in (gen.token_ids, other))
    whole, n_ctx = encode_pair(engine.tokenizer, ctx, cont)
    assert whole[n_ctx:] == gen.token_ids  # (the test tokenizer round-trips these words)
    res = engine.generate_all(
        [
            Request(key=0, id="s", prompt=ctx, continuation=cont),
            Request(key=1, id="t", prompt=ctx, continuation=changed),
        ]
    )
    assert res[0].score.is_greedy and not res[1].score.is_greedy
    assert res[0].score.num_tokens == res[1].score.num_tokens == 3


def test_generate_false_runs_the_prompt_only(setup):
    """OpenAI's echo with max_tokens 0: prompt logprobs, nothing generated, the prompt's text echoed."""
    engine, pm = setup
    sp = SamplingParams(prompt_logprobs=2)
    req = Request(key=0, id="e", adapter="qv8", prompt="w1 w2 w3", sampling=sp, generate=False, echo=True)
    res = engine.generate_all([req])[0]
    assert res.error is None and res.completion_tokens == 0 and res.samples[0].token_ids == []
    assert res.echo_text == "w1 w2 w3"
    ids = [e.id for e in res.prompt_logprobs]
    lp = _hf_logprobs(pm, "qv8", ids)
    for j, e in enumerate(res.prompt_logprobs[1:], start=1):
        _check_entry(e, lp[j - 1], ids[j], 2)


def test_scoring_errors(setup):
    engine, _ = setup
    bad = [
        Request(key=0, id="a", prompt="w1 w2", continuation=""),
        Request(key=1, id="b", messages=[{"role": "user", "content": "x"}], continuation="w3"),
        Request(key=2, id="c", prompt="w1", continuation="w2", sampling=SamplingParams(n=2, temperature=1.0)),
    ]
    got = engine.generate_all(bad)
    assert [r.error.code for r in got] == ["empty_continuation", "invalid_request", "invalid_request"]


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
@pytest.mark.parametrize("value", [-1, 21, 1.5, True])
def test_k_out_of_range_is_refused(field, value):
    from multilora_cli.errors import ConfigError

    with pytest.raises(ConfigError, match=field):
        SamplingParams(**{field: value})
