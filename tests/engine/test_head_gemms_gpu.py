"""One LM-head GEMM for the sampler and the logprobs on CUDA (skipped without a GPU; models/head_check.py). bf16
tiny models (Llama with lm_head-LoRA and modules_to_save-head rows; Gemma 2 with an lm_head LoRA under its final
soft-cap), with decode CUDA graphs and eager:
- at every row count where the start-time check passed, `compute_logits_pair`'s model-dtype logits have exactly
  the bits of `compute_logits` (base rows and adapted-head rows), and its fp32 rows equal `compute_logits_fp32`'s
  of those rows to 1e-5;
- a mixed batch (some rows ask for logprobs, some do not) samples the tokens of a run where no row asks, and its
  logprobs equal those of the two-GEMM path (the runner told the check failed) to 1e-6 relative."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from multilora_cli.config import EngineConfig, SamplingParams
from multilora_cli.engine.engine import Engine
from multilora_cli.engine.request import Request
from multilora_cli.models.head_check import HeadGemms
from tests.engine.test_engine_vocab import KINDS, _build, _prompts

pytestmark = pytest.mark.gpu

ARCH_KINDS = {"llama": ["head", "mts_head", "plain"], "gemma2": ["head", "plain"]}


@pytest.fixture(scope="module", params=sorted(ARCH_KINDS))
def tiny(request, tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    arch = request.param
    kinds = {k: KINDS[k] for k in ARCH_KINDS[arch]}
    return arch, *_build(tmp_path_factory.mktemp(f"head_gemms_{arch}"), arch, kinds)


def _requests(plan, prompts, ask: bool):
    reqs = []
    for i, (p, a) in enumerate(zip(prompts, plan)):
        sp = dict(max_tokens=6, ignore_eos=True)
        if ask and i % 3 != 1:
            sp["logprobs"] = 1 + i % 5
        if i % 4 == 3:
            sp.update(temperature=0.8, seed=i)
        reqs.append(Request(key=i, id=str(i), adapter=a, prompt_token_ids=p, sampling=SamplingParams(**sp)))
    return reqs


def _close(a: float, b: float) -> bool:
    """Within 1e-6 relative (a few fp32 ulps: the two paths' fp32 GEMMs run at different row counts)."""
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


@pytest.mark.parametrize("eager", [False, True])
def test_one_gemm_gives_the_samplers_bits_and_the_two_gemm_logprobs(tiny, eager):
    arch, base, adapters = tiny
    kinds = ARCH_KINDS[arch]
    plan = [kinds[i % len(kinds)] if i % 3 else None for i in range(11)]
    prompts = _prompts(len(plan), seed=21)
    cfg = EngineConfig(
        model=str(base),
        device="cuda",
        dtype="bfloat16",
        max_loras=4,
        max_lora_rank=8,
        max_num_seqs=16,
        num_kv_blocks=256,
        enforce_eager=eager,
    )
    engine = Engine(cfg, adapters)
    try:
        runner = engine.runner
        st = runner.head_gemms.stats()
        assert st["max_rows"] == 16 and st["why"].startswith("checked")
        if not runner.head_gemms.one_gemm(len(plan)):
            pytest.skip(f"the check found the GEMMs' bits differ here: {st}")
        asked = engine.generate_all(_requests(plan, prompts, ask=True))
        plain = engine.generate_all(_requests(plan, prompts, ask=False))
        assert [r.error for r in asked] == [None] * len(plan)
        assert [r.token_ids for r in asked] == [r.token_ids for r in plain]

        # the model's pair against its two calls, at every checked row count (the adapters are in their slots now)
        model, vocab = runner.model, runner.vocab
        heads = [s for s in range(runner.max_loras) if vocab._head_lora[s][0] or vocab._head_of[s] >= 0]
        assert heads, "the run left no lm_head adapter in a slot"
        g = torch.Generator(device="cuda").manual_seed(0)
        for m in range(1, 17):
            if not runner.head_gemms.one_gemm(m):
                continue
            h = torch.randn(m, model.config.hidden_size, device="cuda", generator=g).to(model.dtype)
            slots = np.array([heads[i % len(heads)] if i % 2 else -1 for i in range(m)])
            rows = np.arange(0, m, 2)
            for sl in (None, slots):
                logits, x32 = model.compute_logits_pair(h, rows, sl)
                ref = model.compute_logits(h, upcast=False, slots=sl)
                assert torch.equal(logits.view(torch.int16), ref.view(torch.int16)), (m, sl)
                ref32 = model.compute_logits_fp32(h[torch.from_numpy(rows).cuda()], None if sl is None else sl[rows])
                assert (x32 - ref32).abs().max().item() < 1e-5, m

        runner.head_gemms = HeadGemms.none("test: two GEMMs")
        two = engine.generate_all(_requests(plan, prompts, ask=True))
    finally:
        engine.close()
    for a, b in zip(asked, two):
        assert a.token_ids == b.token_ids
        if a.samples[0].logprobs is None:
            assert b.samples[0].logprobs is None
            continue
        for x, y in zip(a.samples[0].logprobs, b.samples[0].logprobs, strict=True):
            assert [t for t, _, _ in x.top] == [t for t, _, _ in y.top]
            pairs = [(x.logprob, y.logprob)] + [(v, w) for (_, _, v), (_, _, w) in zip(x.top, y.top)]
            assert all(_close(v, w) for v, w in pairs), pairs


def test_stats_name_the_path(tiny):
    arch, base, adapters = tiny
    cfg = EngineConfig(model=str(base), device="cuda", dtype="bfloat16", max_num_seqs=8, num_kv_blocks=64)
    engine = Engine(cfg, {})
    try:
        stats: dict = {}
        engine.annotate_stats(stats)
        got = stats["startup"]["logprob_lm_head"]
        assert got["path"] in ("one_gemm", "two_gemms", "mixed") and got["max_rows"] == 8
        assert got["one_gemm_rows"] == 8 - len(got["mismatched"]) and got["check_s"] >= 0
    finally:
        engine.close()
