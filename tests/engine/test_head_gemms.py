"""One LM-head GEMM for the sampler and the logprobs (models/head_check.py, Model.compute_logits_pair): the check
falls back to two GEMMs at every row count where a GEMM pair's rounded bits differ; the runner follows the
check's answer per step; both paths give the same tokens and logprobs (CPU fp32: lm_head-LoRA and
modules_to_save-head rows, rows that ask and rows that do not, sampled rows); the run's stats name the path."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from multilora_cli.models.head_check import HeadGemms, check_rounding, head_gemms
from tests.engine.test_engine_vocab import KINDS, _build, _prompts

PLAN = ["head", None, "mts_head", "plain", "head", None, "emb"]


def _pair(differ_at: set[int]):
    """A model-dtype GEMM and an fp32-output one that agree after rounding except at the row counts `differ_at`."""
    w = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))

    def model_gemm(h):
        return (h.float() @ w.T).to(torch.bfloat16)

    def fp32_gemm(h):
        out = h.float() @ w.T
        if h.shape[0] in differ_at:  # one element moved by more than a bf16 ulp: its rounding differs
            out[0, 0] += 1.0 + out[0, 0].abs()
        return out

    return model_gemm, fp32_gemm


def test_a_pair_that_differs_falls_back_at_those_row_counts():
    ok = check_rounding(*_pair({3, 7}), 9, 8, torch.bfloat16, "cpu")
    assert ok.tolist() == [False, True, True, False, True, True, True, False, True, True]
    got = HeadGemms(ok, "test", mismatched=[3, 7])
    assert [got.one_gemm(m) for m in range(12)] == [False, True, True, False] + [True] * 3 + [False, True, True] + [
        False
    ] * 2
    st = got.stats()
    assert (st["path"], st["one_gemm_rows"], st["max_rows"], st["mismatched"]) == ("mixed", 7, 9, [3, 7])


def test_a_pair_that_agrees_everywhere_takes_one_gemm():
    ok = check_rounding(*_pair(set()), 5, 8, torch.bfloat16, "cpu")
    assert ok[1:].all()
    assert HeadGemms.none("x").stats()["path"] == "two_gemms" and not HeadGemms.none("x").one_gemm(1)
    assert HeadGemms.every(4, "x").stats()["path"] == "one_gemm"


def test_off_cuda_a_model_dtype_head_takes_two_gemms_and_fp32_one():
    head = torch.nn.Linear(8, 40, bias=False)
    assert head_gemms(SimpleNamespace(lm_head=head), 6).stats()["path"] == "one_gemm"
    assert head_gemms(SimpleNamespace(lm_head=head.to(torch.bfloat16)), 6).stats()["path"] == "two_gemms"
    assert head_gemms(SimpleNamespace(lm_head=head), 0).stats()["path"] == "two_gemms"  # no row fits one chunk


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("head_gemms"), "llama", KINDS)


def _requests(prompts):
    reqs = []
    for i, (p, a) in enumerate(zip(prompts, PLAN)):
        sp = dict(max_tokens=4, ignore_eos=True)
        if i % 2 == 0:
            sp["logprobs"] = 1 + i % 3
        if i % 3 == 1:
            sp.update(temperature=0.9, seed=i, repetition_penalty=1.3)
        reqs.append(Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=SamplingParams(**sp)))
    return reqs


def test_runner_follows_the_check_and_both_paths_agree(tiny):
    base, adapters = tiny
    prompts = _prompts(len(PLAN), seed=5)
    engine = Engine(EngineConfig(model=str(base), device="cpu", max_lora_rank=8, max_loras=6), adapters)
    try:
        runner = engine.runner
        assert runner.head_gemms.stats()["path"] == "one_gemm"  # fp32: the sampler's GEMM is the fp32 one
        stats: dict = {}
        engine.annotate_stats(stats)
        assert stats["startup"]["logprob_lm_head"]["path"] == "one_gemm"
        pair = runner.model.compute_logits_pair
        calls: list[int] = []

        def spy(hidden, rows, slots=None):
            calls.append(hidden.shape[0])
            return pair(hidden, rows, slots)

        runner.model.compute_logits_pair = spy
        one = engine.generate_all(_requests(prompts))
        assert len(PLAN) in calls  # the full batch's steps took one GEMM
        plain = engine.generate_all(
            [replace(r, sampling=replace(r.sampling, logprobs=None)) for r in _requests(prompts)]
        )
        ok = runner.head_gemms.ok.copy()
        ok[len(PLAN)] = False  # as if the check had found the bits differ at the batch's row count
        runner.head_gemms = HeadGemms(ok, "test")
        calls.clear()
        two = engine.generate_all(_requests(prompts))
        assert len(PLAN) not in calls  # the full batch's steps took two GEMMs
    finally:
        engine.close()
    for a, b in zip(one, two):
        assert a.error is None and a.token_ids == b.token_ids
        if a.samples[0].logprobs is None:
            assert b.samples[0].logprobs is None
            continue
        for x, y in zip(a.samples[0].logprobs, b.samples[0].logprobs, strict=True):
            # within 1e-6 relative: a few fp32 ulps (the two paths' GEMMs run at different row counts)
            assert [t for t, _, _ in x.top] == [t for t, _, _ in y.top]
            got, want = [x.logprob] + [v for _, _, v in x.top], [y.logprob] + [v for _, _, v in y.top]
            assert np.allclose(got, want, rtol=1e-6, atol=1e-6)
    # a row's tokens do not depend on whether it or its neighbours ask (greedy rows; sampled rows draw the same u)
    assert [r.token_ids for r in one] == [r.token_ids for r in plain]
