"""Logits processing end to end on CPU fp32 against transformers' `generate` where it has the parameter
(repetition_penalty, min_new_tokens, sequence_bias as logit_bias) and against a float64 reference of OpenAI's
formulas otherwise (frequency / presence penalties, logit_bias), greedy token for token, over a mixed batch of
adapters and base rows. Engines are pinned to the CPU (fp32 exactness is the CPU contract)."""

from __future__ import annotations

import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from tests.builders import build_mixed, load_peft

PLAN = ["qv8", None, "all4rs", "mlp16"]
NEW = 12
EOS = 2  # the tiny Llama config's eos (and the test tokenizer's </s>)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build_mixed(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="module")
def pm(llama):
    return load_peft(*llama)


@pytest.fixture(scope="module")
def engine(llama):
    base, adapters = llama
    return Engine(EngineConfig(model=str(base), device="cpu", max_loras=4, max_lora_rank=16, max_num_seqs=8), adapters)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Prompts with repeated tokens (so the prompt part of repetition_penalty matters)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p = torch.randint(3, 256, (6,), generator=g).tolist()
        out.append(p + p[:3] + torch.randint(3, 256, (3,), generator=g).tolist())
    return out


def run(engine, ps, plan, **sp) -> list:
    sp = {"max_tokens": NEW, **sp}
    reqs = [
        Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=SamplingParams(**sp))
        for i, (p, a) in enumerate(zip(ps, plan))
    ]
    got = engine.generate_all(reqs)
    assert [r.error for r in got] == [None] * len(reqs)
    return got


def hf_generate(pm, prompt, adapter, **kw) -> list[int]:
    """transformers' generate (greedy) for one prompt on `adapter` (None: the base model); eos off unless given."""
    ids = torch.tensor([prompt])
    kw = {"max_new_tokens": NEW, "do_sample": False, "eos_token_id": None, "pad_token_id": 0, **kw}
    with torch.no_grad():
        if adapter is None:
            with pm.disable_adapter():
                out = pm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
        else:
            pm.set_adapter(adapter)
            out = pm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("penalty", [1.5, 0.7])
def test_greedy_repetition_penalty_equals_hf_generate(engine, pm, penalty):
    ps = prompts(len(PLAN), seed=1)
    got = run(engine, ps, PLAN, repetition_penalty=penalty, ignore_eos=True)
    want = [hf_generate(pm, p, a, repetition_penalty=penalty) for p, a in zip(ps, PLAN)]
    assert [r.token_ids for r in got] == want
    plain = [hf_generate(pm, p, a) for p, a in zip(ps, PLAN)]
    assert want != plain  # the penalty changed the text


def test_logit_bias_min_tokens_and_repetition_penalty_equal_hf_generate(engine, pm):
    """eos pushed to the top by logit_bias (HF: sequence_bias), kept out until min_tokens (HF: min_new_tokens),
    and a repetition penalty on top (bias before the penalty in both): eos comes right at min_tokens."""
    ps = prompts(len(PLAN), seed=2)
    bias = {EOS: 30.0, 7: 5.0, 11: -3.5}
    got = run(engine, ps, PLAN, logit_bias={str(k): v for k, v in bias.items()}, min_tokens=4, repetition_penalty=1.2)
    seq_bias = [[[k], v] for k, v in bias.items()]
    for r, p, a in zip(got, ps, PLAN):
        want = hf_generate(pm, p, a, sequence_bias=seq_bias, min_new_tokens=4, repetition_penalty=1.2, eos_token_id=EOS)
        assert want[-1] == EOS and len(want) == 5
        assert r.token_ids == want[:-1] and r.finish_reason == "stop" and r.completion_tokens == 5


def _reference_logits(x: torch.Tensor, prompt, out, sp: SamplingParams) -> torch.Tensor:
    """float64 reference: logit_bias added, repetition penalty over prompt + output (transformers), then
    OpenAI's logit -= frequency * count + presence * (count > 0) over the output."""
    x = x.double().clone()
    for t, b in sp.logit_bias.items():
        x[t] += b
    seen = torch.zeros_like(x, dtype=torch.bool)
    seen[list(prompt) + list(out)] = True
    p = sp.repetition_penalty
    x = torch.where(seen, torch.where(x > 0, x / p, x * p), x)
    count = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=x.shape[0]).double()
    return x - (sp.frequency_penalty * count + sp.presence_penalty * (count > 0).double())


@pytest.mark.parametrize(
    "fields",
    [
        dict(frequency_penalty=1.5, presence_penalty=0.5),
        dict(frequency_penalty=-0.8, presence_penalty=2.0, logit_bias={"40": 2.5, "41": -100}),
        dict(frequency_penalty=0.4, presence_penalty=-1.0, repetition_penalty=1.1, logit_bias={"9": 1.0}),
    ],
)
def test_openai_penalties_equal_a_float64_reference(engine, pm, fields):
    ps = prompts(len(PLAN), seed=3)
    got = run(engine, ps, PLAN, ignore_eos=True, **fields)
    sp = SamplingParams(**fields)
    for r, p, a in zip(got, ps, PLAN):
        out: list[int] = []
        with torch.no_grad():
            for _ in range(NEW):
                ids = torch.tensor([p + out])
                if a is None:
                    with pm.disable_adapter():
                        logits = pm(input_ids=ids).logits[0, -1]
                else:
                    pm.set_adapter(a)
                    logits = pm(input_ids=ids).logits[0, -1]
                ref = _reference_logits(logits, p, out, sp)
                top2 = ref.topk(2).values
                assert top2[0] - top2[1] > 1e-4, "a near-tie: pick another case"
                out.append(int(ref.argmax()))
        assert r.token_ids == out
    assert [r.token_ids for r in got] != [r.token_ids for r in run(engine, ps, PLAN, ignore_eos=True)]


def test_token_ids_outside_the_vocabulary_are_request_errors(engine):
    ps = prompts(3, seed=4)
    reqs = [
        Request(key=0, id="a", prompt_token_ids=ps[0], sampling=SamplingParams(max_tokens=2, logit_bias={"256": 1})),
        Request(key=1, id="b", prompt_token_ids=ps[1], sampling=SamplingParams(max_tokens=2, stop_token_ids=[999])),
        Request(key=2, id="c", prompt_token_ids=ps[2], sampling=SamplingParams(max_tokens=2, logit_bias={"255": 1})),
    ]
    got = engine.generate_all(reqs)
    assert [r.error.code if r.error else None for r in got] == ["invalid_sampling", "invalid_sampling", None]
    assert got[0].error.message == (
        "request a: logit_bias names token id 256, outside the model's vocabulary (ids 0..255)"
    )
    assert "stop_token_ids names token id 999" in got[1].error.message
